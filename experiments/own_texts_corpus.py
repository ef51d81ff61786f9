"""A permissively licensed English corpus for `far train` on texts: CPython's documentation topics, as .jsonl.

The source is `pydoc_data.topics` of the Python that runs this script (the text `help("topics")`
shows: the language reference's sections; PSF licence), one document per topic, sorted by name, so
the corpus is the same wherever that Python version is installed. About 465k characters, 110k
SmolLM2 tokens for Python 3.11.

    python experiments/own_texts_corpus.py /tmp/python_docs.jsonl
"""

from __future__ import annotations

import json
import pydoc_data.topics
import sys
from pathlib import Path


def main(target: str) -> None:
    topics = pydoc_data.topics.topics
    rows = [json.dumps({"text": topics[name].strip(), "topic": name}) for name in sorted(topics)]
    Path(target).write_text("\n".join(rows) + "\n", encoding="utf-8")
    print(f"{len(rows)} topics, {sum(len(t) for t in topics.values()):,} characters from {pydoc_data.topics.__file__}")


if __name__ == "__main__":
    main(sys.argv[1])
