"""A command tool for agent-kernel: notes in ../../workspace/notes.json.

stdin is one JSON object: {"phase", "tool", "saga_id", "step", "idempotency_key", "args", "output"}.
execute prints the step's output as JSON; compensate undoes it and exits 0.
"""

import json
import os
import pathlib
import sys

request = json.load(sys.stdin)
store = pathlib.Path("../../workspace/notes.json")
notes = json.loads(store.read_text()) if store.exists() else {}


def save():
    temp = store.with_name(".notes.json.tmp")
    temp.write_text(json.dumps(notes, indent=2))
    os.replace(temp, store)


if request["tool"] == "notes.count":
    print(json.dumps({"notes": len(notes)}))
elif request["phase"] == "execute":
    args = request["args"]
    if args["id"] in notes:
        print(f"a note {args['id']} exists already", file=sys.stderr)
        sys.exit(1)
    notes[args["id"]] = args["text"]
    save()
    print(json.dumps({"notes": len(notes)}))
elif request["phase"] == "compensate":
    # Safe whether or not the effect happened: remove the note if it is there.
    if notes.pop(request["args"]["id"], None) is not None:
        save()
