"""Whether a Hugging Face Hub model can be loaded here, asked before hours of work need it.

With the Hub offline (``HF_HUB_OFFLINE``, as on development and CI machines), a Hub id loads
only from the local cache; a scorer that is neither a folder nor cached would fail only after
every sample was generated, with a long Hugging Face traceback. Callers ask first and name the
option that avoids it.
"""

from __future__ import annotations

import os
from pathlib import Path

from setdlm.util.errors import UserError

TRUE = ("1", "true", "yes", "on")


def hub_offline(datasets: bool = False) -> bool:
    """Whether the Hub is switched off for models (or, with ``datasets``, for data sets)."""
    variables = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if datasets else ("HF_HUB_OFFLINE",)
    return any(os.environ.get(name, "").lower() in TRUE for name in variables)


def loadable_offline(name: str) -> bool:
    """A model folder, or a Hub id (or a published key's) whose config is in the local cache."""
    if Path(name).expanduser().is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache

    from setdlm.checkpoints.zoo import resolve

    spec = resolve(name) if ":" in name else None
    if spec is not None:  # a key (owt:ar): its repository's, at its pinned commit if any
        found = try_to_load_from_cache(spec.hub_id, "config.json", revision=spec.revision)
        return isinstance(found, str)

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not even a valid repository id
        return False


def unreachable(name: str) -> bool:
    """Whether loading ``name`` must fail here: the Hub is offline and nothing local has it."""
    return hub_offline() and not loadable_offline(name)


def load_hub_dataset(path: str, *args, instead: str, **kwargs):
    """``datasets.load_dataset(path, ...)``, or a message naming the data set and what to use
    ``instead`` when the Hub cannot be reached (offline here, or the network is down)."""
    if hub_offline(datasets=True):
        raise HubUnreachable(
            f"{path} comes from the Hugging Face Hub, which is offline here (HF_HUB_OFFLINE / "
            f"HF_DATASETS_OFFLINE); {instead}"
        )
    import datasets

    try:
        return datasets.load_dataset(path, *args, **kwargs)
    except ConnectionError as error:
        raise HubUnreachable(
            f"{path}: the Hugging Face Hub does not answer ({error}); {instead}"
        ) from None


def hub_network_errors() -> tuple[type[BaseException], ...]:
    """What a request to the Hub raises when the Hub cannot be reached or refuses it: the
    Hugging Face client's errors, the OS's, and those of whichever HTTP library the client
    uses (its versions moved from requests to httpx)."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    errors: list[type[BaseException]] = [HfHubHTTPError, OSError]
    for module, name in HTTP_LIBRARY_ERRORS:
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


HTTP_LIBRARY_ERRORS = (
    ("httpx2", "HTTPError"),
    ("httpx", "HTTPError"),
    ("requests", "RequestException"),
)


class HubUnreachable(UserError, ConnectionError):
    """A data set or model that only the Hub has, and the Hub cannot be reached."""
