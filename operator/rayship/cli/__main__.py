"""`python -m rayship.cli`: the `rayship` command."""

from rayship.cli import command

command()
