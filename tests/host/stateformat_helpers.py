"""What a state dir's format.json says, read as a person would: the file itself."""
import json


def read_format(state_dir):
    """(format, the caldera version that wrote it); (1, "0.1.0") without a marker (0.1.0 wrote none)."""
    try:
        doc = json.loads((state_dir / "format.json").read_text())
    except FileNotFoundError:
        return 1, "0.1.0"
    return doc["format"], doc["written_by"]
