"""The ``imgshards`` command line: a thin shell over :mod:`imgshards.converter` and :mod:`imgshards.loader`."""
