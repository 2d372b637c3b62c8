"""Who else could use a server without a key: the other login accounts on this machine. Loopback is
not private between accounts, so any of them can call the server (and read ``cached_tokens``, which
confirms guesses about the owner's prompts); ``hearth-cli serve`` warns when such accounts exist."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
PASSWD = Path("/etc/passwd")
MAX_PASSWD_BYTES = 1 << 20  # a machine's account list; a directory-backed one is not in the file anyway
MAX_NAMES = 5  # named in the warning; the rest are counted
FIRST_USER_UID = 1000  # below: system accounts (Debian, Fedora, Arch alike)
NOBODY_UID = 65534
NO_LOGIN = {"nologin", "false", "true", "sync", "shutdown", "halt", ""}


def other_login_accounts(passwd: Path | None = None, uid: int | None = None) -> list[str]:
    """Accounts other than ``uid`` (default: this process's) with a real login shell and a uid of 1000
    or more, in file order; [] when the file cannot be read (a platform without one says nothing)."""
    me = os.getuid() if uid is None else uid
    try:
        with (passwd or PASSWD).open("rb") as f:
            data = f.read(MAX_PASSWD_BYTES)
    except OSError as exc:
        log.debug("cannot read the account list: %s", exc)
        return []
    names = []
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) != 7 or not fields[2].isdigit():
            continue
        account_uid, shell = int(fields[2]), fields[6].strip()
        if account_uid >= FIRST_USER_UID and account_uid not in (me, NOBODY_UID) \
                and shell.rsplit("/", 1)[-1] not in NO_LOGIN:
            names.append(fields[0])
    return names


def unkeyed_warning(api_key: str | None, passwd: Path | None = None) -> str | None:
    """The warning for a server started without a key while other accounts could reach it; None if none."""
    if api_key:
        return None
    others = other_login_accounts(passwd)
    if not others:
        return None
    shown = ", ".join(others[:MAX_NAMES]) + (f" and {len(others) - MAX_NAMES} more" if len(others) > MAX_NAMES else "")
    accounts = "account" if len(others) == 1 else "accounts"
    return (f"{len(others)} other login {accounts} on this machine ({shown}) can use this server without a key and "
            "learn from cached_tokens which prompts it has seen; pass --api-key KEY or --api-key-file FILE")
