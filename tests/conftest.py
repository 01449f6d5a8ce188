"""Test set-up: Triton runs interpreted on the CPU (set before anything imports triton)."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session", autouse=True)
def no_user_tuning_tables(tmp_path_factory):
    """Tests see no user tuning tables (moec tune's output): MOEC_TUNING_DIR names an empty
    folder, for this process and the processes it starts."""
    saved = os.environ.get("MOEC_TUNING_DIR")
    os.environ["MOEC_TUNING_DIR"] = str(tmp_path_factory.mktemp("no-tuned-tables"))
    yield
    if saved is None:
        del os.environ["MOEC_TUNING_DIR"]
    else:
        os.environ["MOEC_TUNING_DIR"] = saved


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One build cache for the whole session: each spec is built once."""
    return tmp_path_factory.mktemp("moec-cache")


@pytest.fixture(scope="session")
def load_layer(cache_dir):
    """load_layer(spec_path_or_text, *overrides) -> the generated package's module."""
    import moec
    from moec.spec import parse_spec

    def load(spec, *overrides):
        if isinstance(spec, str) and "\n" in spec:
            loaded = parse_spec(spec, "<test spec>", list(overrides))
            return moec.load(loaded, cache_dir=cache_dir)
        return moec.load(spec, list(overrides), cache_dir=cache_dir)

    return load
