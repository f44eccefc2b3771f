"""The AdmissionPolicy spec: the core's Policy plus the operator-only fields.

The policy part (slo, outputTokens, concurrency, classes, defaultClass, deferral,
degradation, tenants) is validated by ``slogate_admission.schema.Policy`` itself, so the CRD
and the core cannot drift apart; the operator part (targetRef or selector, container,
calibration, sidecar, alerting, autoscaling) by ``OperatorSpec`` below. crds/ mirrors both, and a
test holds every example and every invalid variant to the same verdict from the CRD's
openAPIV3Schema (with its CEL rules) and from these models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from slogate_admission.schema import Policy
from slogate_admission.validation import validation_problems
from slogate_admission.wire import Model
from slogate_operator import selectors

DnsLabel = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
DnsSubdomain = Annotated[
    str, Field(max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
]
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Quantity = Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")]
Ratio = Annotated[float, Field(gt=0, lt=1)]
HeaderName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")]
"""An HTTP field name (RFC 9110 token)."""
Timeout = Annotated[float, Field(gt=0, le=3600)]


class TargetRef(Model):
    """One Deployment in the policy's namespace."""

    api_version: Literal["apps/v1"] = "apps/v1"
    kind: Literal["Deployment"] = "Deployment"
    name: DnsSubdomain


class SelectorRequirement(Model):
    """A matchExpressions entry, as in Kubernetes label selectors."""

    key: LabelKey
    operator: selectors.Operator
    values: tuple[LabelValue, ...] = ()

    @model_validator(mode="after")
    def _values_fit_operator(self) -> SelectorRequirement:
        self.requirement()  # its SelectorError (a ValueError) says what does not fit
        return self

    def requirement(self) -> selectors.Requirement:
        return selectors.Requirement(self.key, self.operator, self.values)


class LabelSelector(Model):
    """Deployments of the namespace whose labels match; an empty selector is refused
    (it would select every Deployment of the namespace)."""

    match_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()

    @model_validator(mode="after")
    def _not_empty(self) -> LabelSelector:
        if not self.match_labels and not self.match_expressions:
            raise ValueError("selector needs matchLabels or matchExpressions (an empty one selects everything)")
        return self

    def as_selector(self) -> selectors.Selector:
        return selectors.Selector.of(self.match_labels, *(term.requirement() for term in self.match_expressions))


class CalibrationSpec(Model):
    """When and how hard the operator calibrates."""

    on_rollout: bool = True
    """Recalibrate when the llama.cpp container's fingerprint changes."""
    timeout_seconds: Annotated[int, Field(ge=30, le=7200)] = 300
    """The whole Job (model load included): its activeDeadlineSeconds."""
    budget_seconds: Annotated[float, Field(gt=0, le=3600)] = 180.0
    """`slogate calibrate --budget-seconds`: the measurement alone. Twice the command line's
    90 s: in a cluster the calibration pod shares its node with the workload's pods, and the
    minimum work of a one-thread llama-server on a 2-core Intel Xeon node ran past 90 s in
    the end-to-end suite (2026-12-05). Repetitions stop by three quarters of it."""

    @model_validator(mode="after")
    def _budget_fits(self) -> CalibrationSpec:
        if self.budget_seconds >= self.timeout_seconds:
            raise ValueError(
                f"calibration.budgetSeconds ({self.budget_seconds:g}) must be below timeoutSeconds "
                f"({self.timeout_seconds}): the server must also load its model"
            )
        return self


class Resources(Model):
    """Container resources of the injected sidecar."""

    requests: dict[Literal["cpu", "memory", "ephemeral-storage"], Quantity] = Field(default_factory=dict)
    limits: dict[Literal["cpu", "memory", "ephemeral-storage"], Quantity] = Field(default_factory=dict)


class SidecarSpec(Model):
    """The injected gate."""

    inject: bool = True
    """Inject the sidecar into the target Deployments' pods when the API server admits them
    (the operator's webhook; the Deployment keeps your fields, the pods roll off the gate
    with the policy)."""
    port: Port = 8081
    """Client port; it takes over the name of llama-server's port, which a Service targets."""
    admin_port: Port = 8082
    """Admin API and /metrics; the operator pushes thresholds here."""
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    """The slogate image; unset: the operator's default."""
    prompt_counting: Literal["tokenize", "estimate"] = "tokenize"
    """`slogate sidecar --prompt-counting` (docs/sidecar.md)."""
    # The sidecar settings a policy may tune: unset, the sidecar's own default applies
    # (stated once, in slogate_sidecar.settings.SidecarSettings; docs/sidecar.md).
    class_header: HeaderName | None = None
    """`slogate sidecar --class-header`: the header clients name their class in."""
    client_read_timeout_seconds: Timeout | None = None
    """`slogate sidecar --client-read-timeout`: how long a client may take to send its request."""
    upstream_read_timeout_seconds: Timeout | None = None
    """`slogate sidecar --upstream-read-timeout`: how long llama-server may stay silent."""
    overload_status: Literal[429, 503, 529] | None = None
    """`slogate sidecar --overload-status`: the status of a deliberate shed (429 unless set)."""
    resources: Resources | None = None

    @model_validator(mode="after")
    def _ports_differ(self) -> SidecarSpec:
        if self.port == self.admin_port:
            raise ValueError(f"sidecar.port and sidecar.adminPort must differ, both are {self.port}")
        return self

    def settings_flags(self) -> tuple[str, ...]:
        """The `slogate sidecar` flags of the tunable settings this policy sets, in a fixed order."""
        flags: list[str] = []
        for flag, value in (
            ("--class-header", self.class_header),
            ("--client-read-timeout", self.client_read_timeout_seconds),
            ("--upstream-read-timeout", self.upstream_read_timeout_seconds),
            ("--overload-status", self.overload_status),
        ):
            if value is not None:
                flags += [flag, value if isinstance(value, str) else repr(value)]
        return tuple(flags)


class AlertingSpec(Model):
    """Shedding ratios the alert rules compare against (exported as operator metrics)."""

    rejection_ratio_warning: Ratio = 0.05
    rejection_ratio_critical: Annotated[float, Field(gt=0, le=1)] = 0.25

    @model_validator(mode="after")
    def _ordered(self) -> AlertingSpec:
        if self.rejection_ratio_warning >= self.rejection_ratio_critical:
            raise ValueError("alerting.rejectionRatioWarning must be below rejectionRatioCritical")
        return self


class PrometheusSpec(Model):
    """Where KEDA's Prometheus trigger asks the demand query."""

    server_address: Annotated[str, Field(min_length=1, max_length=512, pattern=r"^https?://\S+$")] | None = None
    """The Prometheus base URL KEDA queries; unset: the operator's SLOGATE_OPERATOR_PROMETHEUS_URL."""


class AutoscalingSpec(Model):
    """A KEDA ScaledObject or an HPA per target Deployment, sized by the demand its pods price.

    The signal is ``demand_query`` (slogate_operator.demand_query): ρ, the sum over the pods of
    the rate of each first try's server-seconds on that pod's calibration, so the offered load
    in pods' worth of the workload's own capacity. The autoscaler asks
    ceil(ρ / targetUtilization) pods (AverageValue target), so 2 pods' worth at 0.7 gives 3.
    """

    enabled: bool = False
    engine: Literal["keda", "hpa"] = "keda"
    """keda: a ScaledObject with a Prometheus trigger; hpa: an HPA v2 on the External metric
    slogate_demand_pods, served by prometheus-adapter with the chart's rule."""
    min_replicas: Annotated[int, Field(ge=1)] = 1
    max_replicas: Annotated[int, Field(ge=1)] | None = None
    """Required when enabled; at least minReplicas."""
    target_utilization: Annotated[float, Field(ge=0.01, le=1)] = 0.7
    """The average demand per pod, in server-seconds per second (pods' worth), the autoscaler holds."""
    scale_up_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] | None = None
    """The HPA's scale-up window; unset: derived, startup + the rate window + the polling
    interval (``slogate_admission.scale_up``), startup the target's pods' measured median
    creation to Ready, so that demand shorter than a pod's start-up buys no pod (the gates
    shed it). 0 follows every rise at once (Kubernetes' own default)."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    polling_interval_seconds: Annotated[int, Field(ge=1, le=3600)] = 15
    """KEDA's pollingInterval (the HPA engine polls at the controller manager's own period)."""
    metric_window_seconds: Annotated[int, Field(ge=1, le=3600)] = 60
    """The rate window of the demand query."""
    prometheus: PrometheusSpec = PrometheusSpec()

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.enabled and self.max_replicas is None:
            raise ValueError("autoscaling.maxReplicas is required when autoscaling is enabled")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"autoscaling.maxReplicas ({self.max_replicas}) must be at least minReplicas ({self.min_replicas})"
            )
        return self


class OperatorSpec(Model):
    """The fields only the operator reads."""

    target_ref: TargetRef | None = None
    selector: LabelSelector | None = None
    container: DnsLabel | None = None
    """The llama.cpp container; unset: the first container of the pod."""
    calibration: CalibrationSpec = CalibrationSpec()
    sidecar: SidecarSpec = SidecarSpec()
    alerting: AlertingSpec = AlertingSpec()
    autoscaling: AutoscalingSpec = AutoscalingSpec()

    @model_validator(mode="after")
    def _one_target(self) -> OperatorSpec:
        if (self.target_ref is None) == (self.selector is None):
            raise ValueError("exactly one of targetRef and selector must be set")
        return self


POLICY_KEYS = frozenset(field.alias or name for name, field in Policy.model_fields.items())
"""The spec keys that belong to the core's Policy (camelCase)."""


class SpecError(ValueError):
    """The spec is invalid; the message lists every problem with its path."""


@dataclass(frozen=True, slots=True)
class AdmissionPolicySpec:
    """A validated spec: what to gate (operator) and how (policy)."""

    operator: OperatorSpec
    policy: Policy

    def target_text(self) -> str:
        """What the policy targets, for status and the printer column."""
        if self.operator.target_ref is not None:
            return self.operator.target_ref.name
        assert self.operator.selector is not None
        return self.operator.selector.as_selector().query()


def parse_spec(raw: Mapping[str, Any] | None) -> AdmissionPolicySpec:
    """Split the spec between Policy and OperatorSpec and validate both; SpecError lists problems."""
    if not isinstance(raw, Mapping):
        raise SpecError("spec: must be an object")
    policy_part = {key: value for key, value in raw.items() if key in POLICY_KEYS}
    operator_part = {key: value for key, value in raw.items() if key not in POLICY_KEYS}
    problems: list[str] = []
    policy = operator = None
    try:
        policy = Policy.model_validate(policy_part)
    except ValidationError as invalid:
        problems += _problems(invalid)
    try:
        operator = OperatorSpec.model_validate(operator_part)
    except ValidationError as invalid:
        problems += _problems(invalid)
    if problems or policy is None or operator is None:
        raise SpecError("; ".join(problems))
    return AdmissionPolicySpec(operator=operator, policy=policy)


def _problems(invalid: ValidationError) -> list[str]:
    return validation_problems(invalid, prefix=("spec",))
