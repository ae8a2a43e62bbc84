"""The ``imgshards`` command line: a thin shell over the converter and the loader."""
