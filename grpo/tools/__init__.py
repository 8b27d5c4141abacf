"""Tools around runs: grpo compare (methods side by side), grpo report (plots and HTML), grpo toy."""
