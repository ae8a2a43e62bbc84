"""The loader reads the protocol table (converter/format/protocols.py): which reader pins an object's
version, and what an access-denied error tells to do, per file system.
"""

from __future__ import annotations

import fsspec
import pytest

from imgshards.converter.format import protocols
from imgshards.loader.errors import ShardAccessError
from imgshards.loader.remote.objects import RemoteObject, remote_object
from imgshards.loader.remote.ranges import access_error


@pytest.mark.parametrize(
    ("protocol", "options", "reader"),
    [
        ("https", {}, "_HttpObject"),
        ("http", {}, "_HttpObject"),
        ("s3", {"anon": True}, "_S3Object"),
        ("memory", {}, "RemoteObject"),
        ("file", {}, "RemoteObject"),
    ],
)
def test_the_reader_of_each_file_system(protocol, options, reader):
    fs = fsspec.filesystem(protocol, **options)
    obj = remote_object(fs, "bucket/x.tar", f"{protocol}://bucket/x.tar", 10)
    assert type(obj).__name__ == reader
    assert isinstance(obj, RemoteObject)


def test_an_s3_protocol_without_s3fs_calls_reads_unchecked():
    # A file system that says "s3" but is not s3fs (no _call_s3): plain ranged reads, as before.
    class LikeS3(fsspec.AbstractFileSystem):
        protocol = ("s3",)

    obj = remote_object(LikeS3(), "b/x.tar", "s3://b/x.tar", 10)
    assert type(obj) is RemoteObject


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("https://host/ds/train-000.tar", "headers="),
        ("http://host/ds/train-000.tar", "headers="),
        ("s3://bucket/ds/train-000.tar", "AWS_PROFILE"),
        ("gs://bucket/ds/train-000.tar", protocols.DENIED_HINT),
        ("/data/ds/train-000.tar", protocols.DENIED_HINT),
    ],
)
def test_access_denied_says_what_each_file_system_needs(name, hint):
    error = access_error(PermissionError("403 Forbidden"), name)
    assert isinstance(error, ShardAccessError)
    assert str(error).startswith(f"shard {name}: access denied (PermissionError: 403 Forbidden); ")
    assert hint in str(error)


def test_no_credentials_is_told_by_the_errors_name():
    for class_name in sorted(protocols.NO_CREDENTIALS_ERRORS):
        error = access_error(type(class_name, (Exception,), {})("none found"), "s3://b/x.tar")
        assert error is not None and "no credentials" in str(error)
    assert access_error(ConnectionResetError("reset"), "s3://b/x.tar") is None
