"""The model families: one module (or folder) per family, each building one ``ModelFamily`` record
(``record.py``), listed once in ``registry.py``. docs/design.md has the recipe for adding one."""
