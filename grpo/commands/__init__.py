"""Tools around runs: grpo compare (methods side by side), grpo report (plots and HTML), grpo toy, grpo audit
(the reasoning-chain audit of a run), grpo data filter."""
