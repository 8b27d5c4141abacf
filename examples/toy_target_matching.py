"""Target matching with a Bernoulli table: REINFORCE vs mean baseline vs GRPO (same as `grpo toy`).

Run: python examples/toy_target_matching.py [--seed 3 0 1] [--variant one_logit]
The implementation lives in grpo/commands/toy.py so the installed `grpo toy` command can run it too.
"""

from grpo.commands.toy import main

if __name__ == "__main__":
    main()
