"""Field codecs: a dense field may name its own lossless codec in ``index.json``
(``fields[i].codec``, a numcodecs-style config ``{"id": ..., ...}``), used for that column
instead of the dataset's ``codec``.

Why per field: one modality's columns can need a codec that knows their structure (spike windows:
``shardsmith.spikebits``) while the rest of the shard keeps the dataset's generic codec. Both
encodings store it: zarr names it in the array's ``zarr.json`` (a registered zarr v3 codec), tar
stores the column's members as encoded bytes and its ``_meta.json`` says so. An index with field
codecs is index version 3, so a reader that predates them refuses it with a version error instead
of misreading the bytes; this reader refuses an unknown codec id or a bad config with a
FormatError naming the field.

Registry in the style of numcodecs: ``register_field_codec(id, module, zarr_module)``; the
modules are imported only when a codec is used (numcodecs costs ~0.2 s to import).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from loaders.format.errors import FormatError
from loaders.plugins import load_loader_modalities
from loaders.plugins.registry import Registry

# id -> (module registering the numcodecs codec, the zarr one); a modality registers its own on
# import
FIELD_CODECS: Registry[tuple[str, str]] = Registry("field codec", discover=load_loader_modalities)


def register_field_codec(codec_id: str, module: str, zarr_module: str) -> None:
    FIELD_CODECS.register(codec_id, (module, zarr_module))


# plain zstd (numcodecs' and zarr's own): pixel-major spike windows, whose layout already makes them
# compress
register_field_codec("zstd", "numcodecs.zstd", "zarr.codecs")


def check_config(config: Any, where: str) -> dict[str, Any]:
    """The config as a dict; not a dict with a known ``id`` -> FormatError naming ``where`` and the
    fix."""
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise FormatError(f'{where}: codec must be an object with an "id", got {config!r}')
    if config["id"] not in FIELD_CODECS:
        FIELD_CODECS.discover()
    if config["id"] not in FIELD_CODECS:
        raise FormatError(
            f"{where}: codec {config['id']!r} is unknown to this shardsmith (known: "
            f"{FIELD_CODECS.names()}): upgrade shardsmith, or install the plug-in that adds it"
        )
    return dict(config)


def get_field_codec(config: Any, where: str) -> Any:
    """The numcodecs codec of ``config``; an unknown id or a config it refuses -> FormatError."""
    cfg = check_config(config, where)
    importlib.import_module(FIELD_CODECS.get(cfg["id"])[0])
    import numcodecs  # import weight: numcodecs (~0.2 s), only when a field names a codec

    try:
        return numcodecs.get_codec(dict(cfg))
    except (TypeError, ValueError) as e:
        raise FormatError(f"{where}: bad config for codec {cfg['id']!r} ({e})") from None


def zarr_codec(config: Any, where: str) -> Any:
    """The zarr v3 codec object of ``config`` (for a writer's ``compressors``)."""
    cfg = check_config(config, where)
    get_field_codec(cfg, where)  # the same validation as on read
    importlib.import_module(FIELD_CODECS.get(cfg["id"])[1])
    from zarr.registry import get_codec_class  # import weight: zarr (~0.3 s), only for zarr shards

    rest = {k: v for k, v in cfg.items() if k != "id"}
    return get_codec_class(cfg["id"]).from_dict({"name": cfg["id"], "configuration": rest})


def load_zarr_codecs() -> None:
    """Register every field codec with zarr (before opening a store whose arrays may name one)."""
    for _, (_, zarr_module) in FIELD_CODECS.items():
        importlib.import_module(zarr_module)
