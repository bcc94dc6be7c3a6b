"""Serve a reward recipe: rewards relative to a group for rollouts any trainer sends (`POST /v1/rewards`).

    python -m rrc_jax.service --config=scr.py [--anchors=FILE.json --host=127.0.0.1 --port=8100
                                               --cohort_timeout_s=100 --max_rollouts=4096 --api_key=TOKEN
                                               --max_body_mb=64 --max_client_requests=8192 --max_group_size=64
                                               --max_open_cohorts=1024 --max_call_rollouts=1024
                                               --max_failed_fraction=F --config.FIELD=VALUE]

The recipe is a trainer config: its `reward.kind` (one that rewards another trainer's groups, `group_kinds()`: scr,
agr, prc, the tournaments), that kind's settings (`reward.<kind>`), the judge's (`reward.judge`: votes, swap,
template, temperature, max_new_tokens, max_batch) and the GRM (`models.grm`: a checkpoint directory, or the toy
world's), in this process or, with `inference.engine=openai`, asked of its servers (`inference.url`, several
comma-separated: a judge pool, `rrc_jax.inference.pool`). AGR's anchors (PRC's reference) come from `--anchors`, a
JSON object mapping each prompt to its list of anchors (to its reference response), or with each rollout (AGR's:
a trainer's own, `reward.service_url`). What a request holds and how
cohorts fill, expire and are judged: `rrc_jax.service.app`; OpenRLHF's, slime's and NeMo Gym's requests (`POST
/openrlhf`, `/slime`, `/verify`) carry no group size: theirs is `rl.group_size` (set it to the trainer's samples per
prompt). One process serves; needs the serve extra. SIGTERM or Ctrl-C drains it: every open cohort is judged as it
is (or failed, a single rollout) and every request taken answered before it stops.
"""

from __future__ import annotations

import math
import os

from absl import flags

from rrc_jax import cli
from rrc_jax.errors import ConfigError
from rrc_jax.progress import say
from rrc_jax.service.cohorts import COHORT_TIMEOUT_S
from rrc_jax.service.rewards import read_columns, recipe_app

CONFIG = cli.config_flag("scr.py, agr.py", "Reward recipe (a trainer config)")
_ANCHORS = flags.DEFINE_string("anchors", "", "JSON file: prompt -> its anchors (AGR) or its reference (PRC).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
_PORT = flags.DEFINE_integer("port", 8100, "Port to listen on.")
_TIMEOUT = flags.DEFINE_float("cohort_timeout_s", COHORT_TIMEOUT_S, "Seconds a cohort may stay incomplete after "
                              "its first rollout; then it is judged as it is (two rollouts or more) or failed (below the "
                              "clients' own timeouts: OpenRLHF's 180 s, slime's 120 s).")
_MAX_ROLLOUTS = flags.DEFINE_integer("max_rollouts", 4096, "Most rollouts of one request.")
_API_KEY = flags.DEFINE_string("api_key", "", "Bearer token every request must carry (required to listen beyond "
                               "the loopback); default: $RRC_API_KEY.")
_MAX_BODY = flags.DEFINE_integer("max_body_mb", 64, "Largest request body, in MiB.")
_MAX_CLIENT = flags.DEFINE_integer("max_client_requests", 8192, "Most requests in flight from one client address.")
_MAX_GROUP = flags.DEFINE_integer("max_group_size", 64, "Largest group a rollout may name (its judging holds the "
                                  "judge: a round robin asks G(G-1)/2 pairs).")
_MAX_OPEN = flags.DEFINE_integer("max_open_cohorts", 1024, "Most cohorts filling at once (a rollout that would open "
                                 "another is a 429).")
_MAX_CALL = flags.DEFINE_integer("max_call_rollouts", 1024, "Most rollouts of one judge call, taken in turns among "
                                 "the clients (a request's groups, or a cohort, are never split).")
_MAX_FAILED = flags.DEFINE_float("max_failed_fraction", None, "A judge call whose judge requests failed beyond this "
                                 "share fails its cohorts (default: the recipe's inference.max_failed_fraction).")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve(s) -> None:
    """Check the flags, take the port, load the judge and serve the recipe until interrupted."""
    cli.check_at_least(1, "max_rollouts", "max_body_mb", "max_client_requests", "max_open_cohorts",
                       "max_call_rollouts")
    cli.check_at_least(2, "max_group_size")
    if _MAX_FAILED.value is not None and not 0 <= _MAX_FAILED.value <= 1:
        raise cli.flag_error("max_failed_fraction", "must be in [0, 1] (1: never fail a call for its judge requests)")
    api_key = _API_KEY.value or os.environ.get("RRC_API_KEY", "")
    if _HOST.value not in LOOPBACK and not api_key:
        raise cli.flag_error("host", "listening beyond the loopback needs --api_key (or $RRC_API_KEY): a bearer "
                             "token every request carries")
    if not (math.isfinite(_TIMEOUT.value) and _TIMEOUT.value > 0):
        raise cli.flag_error("cohort_timeout_s", "must be a finite number > 0")
    if not 1 <= _PORT.value <= 65535:
        raise cli.flag_error("port", "must be in 1-65535")
    from rrc_jax.inference.server import bind  # the serve extra (starlette, uvicorn)
    from rrc_jax.service.app import service_server  # the serve extra (starlette)

    kind = s.reward_kind
    if s.rollout.group_size > _MAX_GROUP.value:
        raise cli.flag_error("max_group_size", f"{_MAX_GROUP.value} is below the recipe's rl.group_size="
                             f"{s.rollout.group_size}")
    columns = read_columns(_ANCHORS.value, kind, tuple(s.reward.columns))
    try:
        sock = bind(_HOST.value, _PORT.value)
    except OSError as e:
        raise ConfigError(f"--host={_HOST.value} --port={_PORT.value}: cannot listen there ({e.strerror or e}); "
                          "choose a free port, or stop what holds it") from None
    with sock:
        app = recipe_app(s, columns, max_failed_fraction=_MAX_FAILED.value, timeout_s=_TIMEOUT.value,
                         max_rollouts=_MAX_ROLLOUTS.value, api_key=api_key, max_body_bytes=_MAX_BODY.value << 20,
                         max_client_requests=_MAX_CLIENT.value, max_group_size=_MAX_GROUP.value,
                         max_open_cohorts=_MAX_OPEN.value, max_call_rollouts=_MAX_CALL.value)
        say(f"serving {kind} rewards judged by {app.state.grm} on http://{_HOST.value}:{_PORT.value}/v1/rewards")
        service_server(app).run(sockets=[sock])  # SIGTERM: drains, answers every request taken, stops


def main(argv: list[str]) -> None:
    settings = cli.settings_value(CONFIG, argv, "scr.py")
    cli.exit_on_user_error(serve, settings, also=(ValueError,))


if __name__ == "__main__":
    cli.start(main)
