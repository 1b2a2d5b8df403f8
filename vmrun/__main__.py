"""`python -m vmrun` is the same as the `vmrun` console script."""

from vmrun.cli.main import main

if __name__ == "__main__":
    main()
