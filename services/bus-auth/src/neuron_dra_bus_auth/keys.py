"""``neuron-dra-bus-auth-keys``: the callout's secrets, made once per installation.

Three values: the issuer's account seed (``issuer.nk``, only the callout reads it), its public
key (``issuer.pub``, the server's ``auth_callout { issuer }``) and the password of the
callout's own NATS user (``password``, shared by the callout and the server). Printed as the
``neuron-dra-bus-auth`` Secret the ``bus-auth`` kustomize component reads
(``... | kubectl create -f -``: ``create``, so an existing Secret is never replaced by new
keys), or written as files (``--out-dir``, the local stack), keeping files already there.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from neuron_dra_bus_auth.natsjwt import Signer, new_account_seed

__all__ = ["SECRET_NAME", "Keys", "main", "new_keys", "secret_manifest", "write_files"]

SECRET_NAME: Final = "neuron-dra-bus-auth"
SEED: Final = "issuer.nk"
PUBLIC: Final = "issuer.pub"
PASSWORD: Final = "password"


class Keys(msgspec.Struct, frozen=True, kw_only=True):
    seed: str
    public_key: str
    password: str

    def files(self) -> dict[str, str]:
        return {SEED: self.seed, PUBLIC: self.public_key, PASSWORD: self.password}


def new_keys() -> Keys:
    """A fresh issuer and callout password."""
    seed = new_account_seed()
    # The server reads the password from its environment as a config value: one that begins
    # with a digit would be taken for a number and refused, so it begins with a letter.
    password = "p" + secrets.token_hex(24)
    return Keys(seed=seed.decode(), public_key=Signer(seed).public_key, password=password)


def secret_manifest(keys: Keys, *, namespace: str) -> dict[str, object]:
    """The Secret the component's callout and NATS server read ``keys`` from."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET_NAME, "namespace": namespace},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.files().items()},
    }


def write_files(folder: Path) -> Keys:
    """The keys under ``folder`` (one file each, only the owner reads the secret ones); new
    ones only when none are there yet, so a restarted stack keeps its issuer."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in (SEED, PUBLIC, PASSWORD)}
    if all(p.exists() for p in paths.values()):
        return Keys(
            seed=paths[SEED].read_text().strip(),
            public_key=paths[PUBLIC].read_text().strip(),
            password=paths[PASSWORD].read_text().strip(),
        )
    keys = new_keys()
    for name, value in keys.files().items():
        paths[name].write_text(value)
        if name != PUBLIC:
            paths[name].chmod(0o600)
    return keys


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-dra-bus-auth-keys",
        description="Make the auth callout's issuer key and password: print them as the "
        f"{SECRET_NAME} Secret, or write them as files with --out-dir.",
    )
    parser.add_argument("--namespace", default="neuron-dra-driver", help="the Secret's namespace")
    parser.add_argument(
        "--out-dir", default="", help=f"write {SEED}, {PUBLIC}, {PASSWORD} here instead"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.out_dir:
        print(write_files(Path(args.out_dir)).public_key)
        return 0
    manifest = secret_manifest(new_keys(), namespace=args.namespace)
    print(msgspec.json.format(msgspec.json.encode(manifest)).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
