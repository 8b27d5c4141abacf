"""The run's configuration: one flat dataclass (fields.py) whose fields are grouped by the part of grpo
that reads them (sections.py), parsing of values (parse.py), YAML and key=value loading and the
generated documentation (io.py)."""

from grpo.config.fields import Config
from grpo.config.io import field_docs, keys_help, load_config
from grpo.errors import ConfigError

__all__ = ["Config", "ConfigError", "field_docs", "keys_help", "load_config"]
