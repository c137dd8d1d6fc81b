"""instructor against a live gateway, run from ``.venv-instructor`` (its own environment: see
deploy/instructor.txt): ``python instructor_client.py URL KEY MODEL``. Each mode's default
structured request must come back as a valid ``City``; prints one JSON line per mode."""

from __future__ import annotations

import json
import sys

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field


class City(BaseModel):  # bounded, so a random model's output ends within the context
    name: str = Field(max_length=24)
    population: int = Field(ge=0, le=10**9)
    capital: bool


def main(url: str, key: str, model: str) -> None:
    base = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(base, mode=mode)
        city = client.chat.completions.create(
            model=model,
            response_model=City,
            messages=[{"role": "user", "content": "A city, please."}],
            max_retries=0,  # the first answer must parse: no re-asking
        )
        assert isinstance(city, City)
        print(json.dumps({"mode": mode.value, "city": city.model_dump()}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
