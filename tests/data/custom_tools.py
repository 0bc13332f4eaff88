"""Typed Python functions as a user's own tools (tests/unit/test_custom_env.py)."""

NOTES: list[str] = []


def get_weather(city: str, unit: str = "celsius") -> dict:
    """Get the current weather of a city.

    Args:
        city: The city's name.
        unit: celsius or fahrenheit.
    """
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit}


def convert_currency(amount: float, source: str, target: str) -> float:
    """Convert an amount of money from one currency to another.

    Args:
        amount: How much money.
        source: The currency code it is in, e.g. EUR.
        target: The currency code wanted, e.g. USD.
    """
    if source == target:
        raise ValueError("source and target are the same currency")
    return round(amount * 1.1, 2)
