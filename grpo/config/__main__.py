"""python -m grpo.config [SECTION]: print the config keys with their defaults and meanings, section by
section, or one section (the documentation's pages are written by ``python -m grpo.docs``)."""

import sys

from grpo.config.io import keys_help

try:
    print(keys_help(sys.argv[1] if len(sys.argv) > 1 else None))
except KeyError as e:
    sys.exit(f"python -m grpo.config: {e.args[0]}")
