"""Files on disk, written so that nothing is lost: atomic files and folders, step folders with manifests.

>>> from far.storage.atomic import atomic_file, write_json
>>> with atomic_file("runs/a/metrics.json") as tmp:   # written whole under a temporary name, then renamed
...     tmp.write_text("{}")
"""
