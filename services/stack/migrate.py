"""An older data directory's single embedded database split into one per service, on the first start that finds it.

Before each service had a database of its own, `make run` kept every collection in one nx-27017 file,
`<data dir>/db/trainmaster.db` (nx-27017 keeps a file per database, named after it). Each service now gets a
copy of it under its own name, where its own server reads it (`<data dir>/db/<service>/<database>.db`), and the
old file is renamed aside: kept, never read again. A copy also holds the other services' collections, unread.
"""

import os
import sqlite3
from contextlib import closing
from pathlib import Path

SINGLE = "trainmaster.db"
SET_ASIDE = "trainmaster.db.split"  # the single file once every service has its copy


def split_single_database(db_dir: Path, databases: dict[str, str]) -> list[str]:
    """Copy `db_dir/trainmaster.db` for each service (name -> its database) that has no file of its own yet, then
    set it aside; the services that got a copy. A copy is SQLite's backup (what a write-ahead log still held
    included), written beside and renamed into place, so a start killed halfway copies again the next time."""
    single = db_dir / SINGLE
    if not single.is_file():
        return []
    copied = []
    for service, database in databases.items():
        target = db_dir / service / f"{database}.db"
        if target.exists():
            continue
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)
        with closing(sqlite3.connect(single)) as source, closing(sqlite3.connect(partial)) as copy:
            source.backup(copy)
        os.chmod(partial, 0o600)
        partial.replace(target)
        copied.append(service)
    single.replace(db_dir / SET_ASIDE)
    return copied
