"""``python -m imgshards.cli`` runs the ``imgshards`` command."""

from .main import main

main()
