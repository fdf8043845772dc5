"""Every conversion between tfcluster's values and the wire messages (tfcluster.api.v1), in one place.

What arrives from the network is checked here, at the edge: a bad or oversized field raises ValueError
naming it (the servers answer INVALID_ARGUMENT), so nothing malformed reaches the core. What the CLI prints
with --json, built from these messages, is in views.py. One module per part of the API: fields.py (the
limits and checks every field passes), nodes.py (what agents send), commands.py (what the coordinator tells
them), specs.py (job specs and sweeps), status.py (the control API's answers); `wire.X` names them all.
"""

from tfcluster.wire.fields import (MAX_TEXT, MAX_LOG_TAIL_LINES, MAX_TASKS_PER_NODE, MAX_JOB_IDS,
                                   MAX_HEARTBEAT_INTERVAL_SECONDS, MAX_PROBE_TARGETS, MAX_PROBE_LISTEN_SECONDS, PHASES,
                                   PHASE_NAMES)  # noqa: F401
from tfcluster.wire.nodes import (gpu_to_proto, gpu_from_proto, node_info_to_proto, node_info_from_proto,
                                  task_report_to_proto, task_report_from_proto, heartbeat_to_proto,
                                  environment_to_proto, environment_from_proto, condition_from_proto, health_from_proto,
                                  conditions_to_proto, conditions_from_proto, progress_from_proto, evaluation_to_proto,
                                  evaluation_from_proto, sync_result_to_proto, sync_result_from_proto,
                                  log_data_to_proto, summary_to_proto, summary_from_proto, log_data_from_proto,
                                  probe_answer_to_proto, probe_answer_from_proto, ended_jobs_request,
                                  ended_jobs_request_from_proto, ended_jobs_response, ended_jobs_from_proto)  # noqa: F401
from tfcluster.wire.commands import (command_to_proto, command_from_proto)  # noqa: F401
from tfcluster.wire.specs import (spec_to_proto, spec_from_proto, sweep_spec_to_proto, sweep_spec_from_proto,
                                  sweep_status)  # noqa: F401
from tfcluster.wire.status import (node_status, job_status, plan_response, usage_response, WAITING_TO_BE_TRIED,
                                   queued_job, policy_response, diagnose_response)  # noqa: F401
