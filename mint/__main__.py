"""`python -m mint` is the `mint` command."""

from mint.cli.main import main

main()
