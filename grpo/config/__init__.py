"""The run's configuration: one flat dataclass (fields.py), parsing of values (parse.py), YAML and
key=value loading and the generated documentation (io.py)."""

from grpo.config.fields import Config
from grpo.config.io import field_docs, load_config, markdown_table, update_readme
from grpo.errors import ConfigError

__all__ = ["Config", "ConfigError", "field_docs", "load_config", "markdown_table", "update_readme"]
