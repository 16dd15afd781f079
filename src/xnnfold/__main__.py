import sys

from .cli import main

# Guarded: a spawned process (the report lowers each variant in one) imports the parent's
# __main__ module again, and must not run the command a second time.
if __name__ == "__main__":
    sys.exit(main())
