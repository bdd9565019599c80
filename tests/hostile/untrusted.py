"""Hostile cases of issue 45 (a dataset you did not build; point 20): an ``index.json`` that names
files outside the folder (item 1), plug-in modules to import (item 2) or no digest (item 3), each
opened as a local folder and from a real S3 server (moto), and a forged push record (item 7, in
``tests/hostile/remote.py``). Tests: ``tests/test_untrusted_dataset.py``.

``data``: for a name case ``(key, name)``, where ``{outside}`` is a folder beside the cache,
``{up}`` sixteen ``../`` and ``{rel}`` that folder without its leading ``/``; for a plug-in case
the list ``plugins`` is given; for a digest case what is done ("plugins": a module added without
sealing again, "no-digest": the digest removed).
"""

from __future__ import annotations

from tests.hostile import Case

NAMES = "test_untrusted_dataset::test_a_name_leaving_the_folder_refuses_the_dataset"
PLUGINS = "test_untrusted_dataset::test_a_plugin_the_caller_did_not_allow_is_never_imported"
UNSEALED = "test_untrusted_dataset::test_an_unsealed_index_of_the_current_version_is_refused"

_REFUSED = (
    "`FormatError` at open naming the key (`{key} = ...`: not a plain file name), local folder "
    "and S3; `shardsmith inspect` exits 2; nothing written outside (was: downloaded and renamed "
    "outside the cache, `inspect s3://` too through the condition table)"
)
_NAMES = [  # (id, key, name, what)
    ("index-shard-name-absolute", "shards[].file", "{outside}/abs.tar", "an absolute path"),
    (
        "index-shard-name-dotdot-pth",
        "shards[].file",
        "{up}{rel}/site-packages/zz.pth",
        "`../` x 16 then a folder's `site-packages/zz.pth` (a `.pth` runs at the next start)",
    ),
    (
        "index-shard-name-in-a-folder",
        "shards[].file",
        "site-packages/zz.pth",
        "`site-packages/zz.pth` (a folder in the name: no build writes one)",
    ),
    (
        "index-conditions-name-dotdot-pth",
        "conditions.file",
        "{up}{rel}/site-packages/zz.pth",
        "`../` x 16 then `site-packages/zz.pth`",
    ),
    ("index-conditions-name-absolute", "conditions.file", "{outside}/zz.pth", "an absolute path"),
]

CASES = [
    *[
        Case(
            case_id,
            20,
            f"a re-sealed index.json whose `{key}` is {what}; `ShardDataset`, then `inspect`",
            _REFUSED.format(key=key),
            NAMES,
            (key, name),
        )
        for case_id, key, name, what in _NAMES
    ],
    Case(
        "index-plugin-this",
        20,
        'a re-sealed index.json with `plugins = ["this"]`; `ShardDataset`, then `inspect`',
        "`PluginError` saying how to allow it (`trust_plugins=`, `--trust-plugins`, "
        "`$SHARDSMITH_TRUST_PLUGINS`); `inspect` exits 2; the module is not imported (was: the "
        "Zen of Python printed at open)",
        PLUGINS,
        ["this"],
    ),
    Case(
        "index-plugin-venv-main",
        20,
        'a re-sealed index.json with `plugins = ["venv.__main__"]`; `ShardDataset`, `inspect`',
        "the same: not imported, no venv made in the working folder (was: `inspect` made one, a "
        "trainer's `ShardDataset` died with `SystemExit`)",
        PLUGINS,
        ["venv.__main__"],
    ),
    Case(
        "index-plugins-unsealed",
        20,
        "`plugins` of an index.json edited (a module already imported added) without sealing again",
        "`FormatError` at open: `'plugins' differ(s) from the digest` (index version 5: the "
        "digest covers `plugins`; was: outside the digest)",
        UNSEALED,
        "plugins",
    ),
    Case(
        "index-current-version-digest-missing",
        20,
        "the digest removed from an index.json of the current version, local folder and S3",
        "`FormatError` at open: 'index version 5 without its content digest' (versions 1-3 still "
        "open with a warning; was: a warning)",
        UNSEALED,
        "no-digest",
    ),
]
