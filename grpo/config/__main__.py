"""python -m grpo.config [--update-readme [README.md]]: print the config table or rewrite README's."""

import sys

from grpo.config.io import markdown_table, update_readme

if sys.argv[1:2] == ["--update-readme"]:
    update_readme(sys.argv[2] if len(sys.argv) > 2 else "README.md")
else:
    print(markdown_table())
