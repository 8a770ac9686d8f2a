"""The PHPMQ_* environment variables every command checks before it runs: a name nothing reads
(a typo, an old name) is told in one warning line instead of being ignored silently.

Clients read PHPMQ_BROKER (the CLI), PHPMQ_CURVE_SECRET, PHPMQ_CURVE_SERVER and
PHPMQ_ADMIN_SECRET (phpmq/client/curve.py); the broker reads one variable per setting
(broker/config.py), its key file and admin secret under names of their own.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

import click

PREFIX = "PHPMQ_"
#: The CLI's broker address (shared.broker_option).
BROKER_VARIABLE = "PHPMQ_BROKER"
#: Where `phpmq web` listens, and its users file (cli/web.py).
WEB_BIND_VARIABLE = "PHPMQ_WEB_BIND"
WEB_USERS_VARIABLE = "PHPMQ_WEB_USERS"
#: The build's (setup.py: compile the hot path): a shell may keep it exported.
COMPILE_VARIABLE = "PHPMQ_COMPILE"


def client_variables() -> frozenset[str]:
    """The names clients read, and `phpmq web`'s (a client too)."""
    from ..client.curve import ADMIN_SECRET_VARIABLE, SECRET_VARIABLE, SERVER_VARIABLE

    return frozenset(
        {BROKER_VARIABLE, SECRET_VARIABLE, SERVER_VARIABLE, ADMIN_SECRET_VARIABLE}
        | {WEB_BIND_VARIABLE, WEB_USERS_VARIABLE}
    )


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The PHPMQ_* names in `environ` that neither a client nor the broker reads."""
    given = {name for name in environ if name.startswith(PREFIX)} - {
        BROKER_VARIABLE,
        COMPILE_VARIABLE,
    }
    if not given:
        return []
    unknown = given - client_variables()
    if unknown:  # the broker's names are looked up only then: `phpmq send` stays light
        from ..broker.config import ENVIRONMENT_VARIABLES

        unknown -= ENVIRONMENT_VARIABLES
    return sorted(unknown)


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """One line on stderr per unknown PHPMQ_* variable, with the name it may have meant."""
    names = unknown_variables(environ)
    if not names:
        return
    from ..broker.config import ENVIRONMENT_VARIABLES

    # Compared without the prefix every name shares, which would make any two look alike.
    known = sorted(name.removeprefix(PREFIX) for name in ENVIRONMENT_VARIABLES | client_variables())
    for name in names:
        close = difflib.get_close_matches(name.removeprefix(PREFIX), known, n=1)
        hint = f"; did you mean {PREFIX}{close[0]}?" if close else ""
        click.echo(f"phpmq: warning: {name} is not a phpmq variable: ignored{hint}", err=True)
