"""A tool of one's own on a dataset of one's own, without per-row worked examples (docs/design/tool-format.md).

    python bench/tool_on_user_data.py FOLDER

writes FOLDER/town_tools.py (a lookup tool over 48 invented towns, whose populations only the tool
knows) and FOLDER/towns.jsonl (one question per town, its answer), then prints the runs measured:
from FOLDER, `grpo train task=towns.jsonl prompt_field=question tools=town_tools:population ...`, with
the worked exchange built from the tool's schema (the default), from a call given once, or none.
"""

import json
import random
import sys
from pathlib import Path

SYLLABLES = ["var", "nel", "os", "ter", "by", "mar", "lin", "dor", "ka", "ve", "ran", "tho", "mi", "sel", "gar",
             "bo", "len", "quin", "zu", "rat"]
TOOL = '''

def population(town: str) -> str:
    """Look up how many people live in a town.

    Args:
        town: The town's name, for example "Varnel".
    """
    value = POPULATION.get(town.strip().strip('"').strip("'").title())
    return "unknown town" if value is None else str(value)
'''
RUN = ("grpo train task=towns.jsonl prompt_field=question tools=town_tools:population rewards=numeric "
       "max_completion_length=64 rollout_engine=fast progress=false")


def main(folder: Path) -> None:
    rng = random.Random(7)
    names: set[str] = set()
    while len(names) < 48:
        names.add((rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(SYLLABLES)).capitalize())
    towns = sorted(names)
    population = {t: rng.randint(10000, 99999) for t in towns}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "town_tools.py").write_text('"""A lookup tool over a table only it knows."""\n\nPOPULATION = '
                                          + json.dumps(population, indent=0) + "\n" + TOOL)
    (folder / "towns.jsonl").write_text("".join(json.dumps({"question": f"How many people live in {t}?", "town": t,
                                                            "answer": str(population[t])}) + "\n" for t in towns))
    print(f"cd {folder}\n"
          f"{RUN} eval_max_new_tokens=64 max_steps=5 eval_pass_k=0 output_dir=runB            # schema-built exchange\n"
          f"{RUN} max_steps=2 eval_prompts=0 output_dir=runA 'tool_example_call=population(Varnel)' "
          f"'tool_example_question=How many people live in Varnel?'   # a call given once\n"
          f"{RUN} max_steps=2 eval_prompts=0 output_dir=runC tool_example_call=none   # no worked exchange")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tool_on_user_data"))
