"""``python -m dtypecheck``."""

from dtypecheck.cli import run

if __name__ == "__main__":
    run()
