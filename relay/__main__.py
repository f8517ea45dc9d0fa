"""`python -m relay`: the `relay` command itself, for a venv whose bin/ is not on PATH."""

from relay.cli import main

if __name__ == "__main__":  # guarded: importing the module (as the lint test does) runs nothing
    main()
