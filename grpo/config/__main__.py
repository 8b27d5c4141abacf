"""python -m grpo.config [--update-readme [README.md] | --update-trl-docs [docs/trl.md]]: print the config
table, or rewrite README's config table or docs/trl.md's table of TRL's GRPOConfig names."""

import sys

from grpo.config.io import markdown_table, update_readme
from grpo.config.trl_names import update_docs

if sys.argv[1:2] == ["--update-readme"]:
    update_readme(sys.argv[2] if len(sys.argv) > 2 else "README.md")
elif sys.argv[1:2] == ["--update-trl-docs"]:
    update_docs(sys.argv[2] if len(sys.argv) > 2 else "docs/trl.md")
else:
    print(markdown_table())
