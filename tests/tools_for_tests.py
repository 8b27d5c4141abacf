"""Tools that tests load by module:function path, as a user would."""

POPULATION = {"Lyon": 516092, "Nantes": 320732, "Lille": 236710, "Nice": 342669}


def lookup_population(city: str) -> str:
    """Look up how many people live in a city.

    Args:
        city: The city's name, for example "Paris".
    """
    return str(POPULATION.get(city.strip(), "unknown city"))


def convert(amount: float, unit: str, exact: bool) -> str:
    """Convert an amount to another unit.

    Args:
        amount: How much.
        unit: The unit to convert to.
        exact: Whether to round.
    """
    return f"{amount} {unit}"
