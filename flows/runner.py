"""The Prefect runner of `tokencredit serve`, a child process in a session of its own that ends when serve does,
however serve ends (`tokencredit.pipeline.lifeline`), as each run it starts ends when it does.

`python -m tokencredit.flows.runner ARGS.pickle` registers the scheduled-annotate (or scheduled-rounds) deployment
with the server that PREFECT_API_URL names and starts each of its runs as it comes due, in a child process.
On SIGTERM (from `serve`, which alone receives a Ctrl-C) Prefect's runner stops polling and ends the
runs in progress (SIGTERM to each; each records `stopped` under its folder); its own log lines about
that are silenced, since `serve` says in one line that it stopped.
"""
from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys

from prefect.runner import Runner

from tokencredit.flows.prefect_server import wait_healthy
from tokencredit.flows.scheduled_run import RUNNER_PID, deployment


GRACE_S = 3  # for Prefect to end the runs in progress; serve then kills what is left of this session


class QuietStopRunner(Runner):
    """Prefect's runner, stopping on SIGTERM without a word: Prefect cancels the runs in progress for up
    to GRACE_S (each run that ends in time records `stopped`; one still working, e.g. a shard's sampling
    thread, is killed by serve and reads as incomplete), then the process exits. Prefect's own shutdown
    (its observers and clients) took 10-15 s more on a busy machine, with nothing left to record."""

    def handle_sigterm(self, *args, **kwargs) -> None:
        if not self.started or self._loop is None:
            os._exit(0)
        if self.stopping:
            return
        self.stopping = True
        # serve prints the one line about the stop: this process's output and its runs' (which it relays)
        # would repeat it in Prefect's words
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.dup2(devnull, sys.stderr.fileno())
        self.execute_in_background(self._cancel_and_exit)

    async def _cancel_and_exit(self) -> None:
        import anyio

        self._scheduled_run_poller.stopping = True
        with anyio.move_on_after(GRACE_S):
            await self.cancel_all()
        os._exit(0)


def main(args_path: str) -> int:
    with open(args_path, "rb") as handle:
        args = pickle.load(handle)
    schedule_text, poll_s = args.pop("schedule_text"), args.pop("poll_s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # serve decides when to stop (SIGTERM)
    os.environ[RUNNER_PID] = str(os.getpid())  # each run, a process of its own, ends with this one
    runner = QuietStopRunner(name=f"tokencredit-serve-{args['name']}", query_seconds=poll_s, prefetch_seconds=poll_s,
                             limit=None, pause_on_shutdown=False)
    try:
        wait_healthy(os.environ["PREFECT_API_URL"])  # serve starts this process beside its server
        deployment_id = runner.add_deployment(deployment(**args))
        missed = drop_missed_runs(deployment_id)
    except Exception as error:  # the server refused it, or is gone
        print(f"tokencredit serve: error: the deployment could not be registered: {error}", file=sys.stderr)
        return 2
    print(f"serving {args['name']!r}: {schedule_text}, each run into {args['out'].rstrip('/')}/{args['folder']}; "
          f"stop with Ctrl-C" + (f" ({missed} runs missed while it was not served: cancelled)" if missed else ""),
          flush=True)
    asyncio.run(_start(runner))
    return 0


def drop_missed_runs(deployment_id) -> int:
    """Cancel the deployment's scheduled runs that came due before now (while no runner served it): like cron,
    serve does not catch up, and a run started now would be named by a time long past. Returns how many."""
    import datetime

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterExpectedStartTime, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    due = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
                        expected_start_time=FlowRunFilterExpectedStartTime(
                            before_=datetime.datetime.now(datetime.timezone.utc)))
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=due,
                                     deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
        for run in runs:
            client.set_flow_run_state(run.id, Cancelled(message="missed: no runner served it when it came due"),
                                      force=True)
    return len(runs)


async def _start(runner: Runner) -> None:
    # Runner.start installs its SIGTERM handler with signal.signal, which runs only once the event loop
    # wakes up (its next timer, seconds later); registered with the loop too, a signal wakes it at once
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, runner.handle_sigterm)
    await runner.start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
