"""Build the tool-calling demo set: templated requests over 13 small tools.

    python -m tokencredit.verifiers.demo.build_tools     # rewrites demo/tools.jsonl

Deterministic (fixed seed, no downloads): the JSONL comes out byte-identical on every run.
Every argument of a reference call is written out in the request ("... 10 results starting at
offset 20"), so the calls are derivable from the prompt; counts, limits and offsets make an
off-by-one value wrong. A quarter of the records ask for two calls. The prompt lists the
needed tools plus one or two others, compactly (`name(param: type, optional?: type)`). The
reference response is `tokencredit.verifiers.tools.render_calls` of the reference calls, and `build`
asserts that it scores 1.0 on both rewards. Every 5th record is `"split": "test"`.
"""
from __future__ import annotations

import random
from pathlib import Path

from tokencredit.schemas.records import TaskRecord, ToolCall, ToolSpec
from tokencredit.verifiers import tools
from tokencredit.verifiers.demo import write_jsonl

SEED = 4321
HERE = Path(__file__).parent
OUT_JSONL = HERE / "tools.jsonl"
N_RECORDS = 200
TEST_EVERY = 5
TWO_CALL_SHARE = 0.25
MAX_PROMPT_CHARS = 450
INSTRUCTION = "Answer with the call(s) as <tool_call>{...}</tool_call>."


def _tool(name: str, description: str, params: dict, required: list[str]) -> dict:
    """A JSON-schema tool; `params` maps name -> type or (type, enum values)."""
    props = {k: {"type": v} if isinstance(v, str) else {"type": v[0], "enum": v[1]} for k, v in params.items()}
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props, "required": required}}


TOOLS = {t["name"]: t for t in [
    _tool("get_weather", "Current weather in a city.", {"city": "string", "unit": ("string", ["celsius", "fahrenheit"])}, ["city"]),
    _tool("get_forecast", "Weather forecast for the next days.", {"city": "string", "days": "integer"}, ["city", "days"]),
    _tool("create_event", "Add an event to the calendar.", {"title": "string", "date": "string", "time": "string"}, ["title", "date"]),
    _tool("list_events", "List calendar events of a day.", {"date": "string", "limit": "integer", "offset": "integer"}, ["date"]),
    _tool("search_web", "Search the web.", {"query": "string", "limit": "integer", "offset": "integer"}, ["query"]),
    _tool("calculate", "Evaluate an arithmetic expression.", {"expression": "string"}, ["expression"]),
    _tool("calculate_tip", "Tip for a bill.", {"bill": "number", "percent": "integer"}, ["bill", "percent"]),
    _tool("convert_units", "Convert a value between units.", {"value": "number", "from_unit": "string", "to_unit": "string"},
          ["value", "from_unit", "to_unit"]),
    _tool("send_email", "Send an email.", {"to": "string", "subject": "string", "body": "string"}, ["to", "subject", "body"]),
    _tool("set_reminder", "Set a reminder.", {"text": "string", "minutes": "integer"}, ["text", "minutes"]),
    _tool("get_stock_price", "Latest price of a stock.", {"symbol": "string"}, ["symbol"]),
    _tool("translate_text", "Translate text.", {"text": "string", "target_language": "string"}, ["text", "target_language"]),
    _tool("get_news", "Latest news stories.", {"topic": "string", "count": "integer"}, ["topic"]),
]}

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Rome", "Berlin", "Madrid"]
DATES = ["2024-06-03", "2024-06-10", "2024-07-01", "2024-08-15", "2024-09-20"]
TIMES = ["09:00", "12:30", "15:00", "18:45"]
EVENTS = ["Team lunch", "Dentist", "Book club", "Gym", "Call mom"]
QUERIES = ["cheap flights", "pasta recipes", "bike repair", "python tutorials", "jazz concerts"]
EXPRESSIONS = ["12 * 7", "45 + 17", "144 / 12", "93 - 48", "8 * 8"]
UNIT_PAIRS = [("km", "miles"), ("kg", "pounds"), ("liters", "gallons"), ("meters", "feet")]
PEOPLE = ["ana@example.com", "bob@example.com", "kim@example.com"]
SUBJECTS = [("Lunch", "See you at noon"), ("Report", "The report is ready"), ("Trip", "I land at six")]
CHORES = ["buy milk", "call the bank", "water the plants", "take a break"]
SYMBOLS = ["AAPL", "MSFT", "TSLA", "NVDA"]
PHRASES = ["good morning", "thank you", "where is the station"]
LANGUAGES = ["French", "Spanish", "German", "Japanese"]
NEWS = ["science", "sports", "music", "the economy"]


# (tool, request template, arguments drawn from a rng): every argument appears in the request
REQUESTS = [
    ("get_weather", "What's the weather in {city}?", lambda r: {"city": r.choice(CITIES)}),
    ("get_weather", "What's the weather in {city} in {unit}?",
     lambda r: {"city": r.choice(CITIES), "unit": r.choice(["celsius", "fahrenheit"])}),
    ("get_forecast", "Give me the {days}-day forecast for {city}.",
     lambda r: {"city": r.choice(CITIES), "days": r.randint(2, 10)}),
    ("create_event", "Add '{title}' to my calendar on {date}.",
     lambda r: {"title": r.choice(EVENTS), "date": r.choice(DATES)}),
    ("create_event", "Add '{title}' to my calendar on {date} at {time}.",
     lambda r: {"title": r.choice(EVENTS), "date": r.choice(DATES), "time": r.choice(TIMES)}),
    ("list_events", "Show {limit} events on {date} starting at offset {offset}.",
     lambda r: {"date": r.choice(DATES), "limit": r.randint(2, 10), "offset": r.randint(1, 20)}),
    ("search_web", "Search the web for '{query}'.", lambda r: {"query": r.choice(QUERIES)}),
    ("search_web", "Search the web for '{query}' and show {limit} results.",
     lambda r: {"query": r.choice(QUERIES), "limit": r.randint(2, 20)}),
    ("search_web", "Search the web for '{query}': {limit} results starting at offset {offset}.",
     lambda r: {"query": r.choice(QUERIES), "limit": r.randint(2, 20), "offset": r.randint(1, 50)}),
    ("calculate", "What is {expression}?", lambda r: {"expression": r.choice(EXPRESSIONS)}),
    ("calculate_tip", "What is a {percent}% tip on a bill of {bill}?",
     lambda r: {"bill": r.choice([24, 36.5, 80, 112.4]), "percent": r.choice([10, 15, 18, 20])}),
    ("convert_units", "Convert {value} {from_unit} to {to_unit}.",
     lambda r: dict(zip(("value", "from_unit", "to_unit"), (r.choice([3, 5, 2.5, 12, 100]), *r.choice(UNIT_PAIRS))))),
    ("send_email", "Email {to} with subject '{subject}' saying '{body}'.",
     lambda r: dict(zip(("to", "subject", "body"), (r.choice(PEOPLE), *r.choice(SUBJECTS))))),
    ("set_reminder", "Remind me to {text} in {minutes} minutes.",
     lambda r: {"text": r.choice(CHORES), "minutes": r.randint(2, 60)}),
    ("get_stock_price", "What is the stock price of {symbol}?", lambda r: {"symbol": r.choice(SYMBOLS)}),
    ("translate_text", "Translate '{text}' to {target_language}.",
     lambda r: {"text": r.choice(PHRASES), "target_language": r.choice(LANGUAGES)}),
    ("get_news", "Show me {count} news stories about {topic}.",
     lambda r: {"topic": r.choice(NEWS), "count": r.randint(2, 10)}),
]


def draw_request(rng: random.Random, template_index: int) -> tuple[str, dict]:
    """(request sentence, reference call as a dict); arguments in the tool's parameter order."""
    name, template, draw = REQUESTS[template_index]
    args = draw(rng)
    order = list(TOOLS[name]["parameters"]["properties"])
    return template.format(**args), {"name": name, "arguments": {k: args[k] for k in order if k in args}}


def signature(tool: dict) -> str:
    """get_weather(city: string, unit?: string): `?` marks an optional parameter."""
    params = tool["parameters"]
    args = [f"{k}{'' if k in params['required'] else '?'}: {p['type']}" for k, p in params["properties"].items()]
    return f"{tool['name']}({', '.join(args)})"


def draw_record(rng: random.Random, index: int) -> dict:
    while True:
        # the first request cycles through the templates (17, coprime to TEST_EVERY): every
        # template lands in both splits
        requests = [draw_request(rng, index % len(REQUESTS))]
        if rng.random() < TWO_CALL_SHARE:
            requests.append(draw_request(rng, rng.randrange(len(REQUESTS))))
        calls = [call for _, call in requests]
        if len({c["name"] for c in calls}) < len(calls):
            continue  # two calls of one tool read as a repeated request
        text = requests[0][0] + "".join(f" Also {r[0][0].lower()}{r[0][1:]}" for r in requests[1:])
        needed = [c["name"] for c in calls]
        others = sorted(set(TOOLS) - set(needed))
        listed = sorted(needed + rng.sample(others, rng.randint(1, 2)))
        prompt = "Tools:\n" + "".join(f"{signature(TOOLS[n])}\n" for n in listed) + f"Request: {text}\n{INSTRUCTION}"
        if len(prompt) > MAX_PROMPT_CHARS:
            continue
        split = "test" if index % TEST_EVERY == TEST_EVERY - 1 else "train"
        reference = tools.render_calls([ToolCall(c["name"], c["arguments"]) for c in calls])
        return {"id": f"tool-{index:04d}", "task": "tools", "prompt": prompt, "reference_response": reference,
                "tools": [TOOLS[n] for n in listed], "reference_calls": calls, "split": split}


def as_task_record(obj: dict) -> TaskRecord:
    calls = tuple(ToolCall(c["name"], c["arguments"]) for c in obj["reference_calls"])
    spec = ToolSpec(tuple(obj["tools"]), calls)
    return TaskRecord(obj["id"], obj["task"], obj["prompt"], obj["reference_response"], spec, obj["split"])


def build() -> list[dict]:
    rng = random.Random(SEED)
    records = [draw_record(rng, i) for i in range(N_RECORDS)]
    for obj in records:
        scores = tools.verify(as_task_record(obj), obj["reference_response"])
        assert all(s.score == 1.0 for s in scores), (obj["id"], scores)
    for split in ("train", "test"):
        seen = {c["name"] for r in records if r["split"] == split for c in r["reference_calls"]}
        assert seen == set(TOOLS), (split, sorted(set(TOOLS) - seen))
    return records


def main() -> None:
    records = build()
    write_jsonl(records, OUT_JSONL)
    n_test = sum(r["split"] == "test" for r in records)
    n_two = sum(len(r["reference_calls"]) == 2 for r in records)
    print(f"wrote {len(records)} records ({n_test} test, {n_two} with two calls) to {OUT_JSONL}")


if __name__ == "__main__":
    main()
