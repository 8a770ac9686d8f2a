"""`python -m phpmq`: the same command line as `phpmq`."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="phpmq")
