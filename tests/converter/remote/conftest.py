"""The converter's remote tests: servers from tests/remote_servers.py (tests/conftest.py takes them)."""

from ...remote_servers import _no_aws_env  # noqa: F401  (autouse: for the remote tests only)
