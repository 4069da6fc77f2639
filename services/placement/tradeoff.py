"""The exchange rate between money and time: the cluster file's `[placement]` section, per project overrides.

```toml
[placement]
exchange_rate = 2.0            # on-demand dollars worth paying to finish one GPU-hour sooner
cost_sensitive_weight = 0.25   # cost-sensitive jobs value time at this fraction of the rate

[placement.projects.vision]
exchange_rate = 4.0            # this project pays more for speed (billing's budget still bounds it)
```
0 means never rent to save time (only when nothing owned could ever run the job); a very high rate means
earliest finish. Renting is always bounded by the project's budget: billing's admission (`tm.rpc.billing.admit`)
refuses a rental the budget cannot pay for.
"""

from pydantic import BaseModel, ConfigDict, Field

from shared.cluster import ClusterFile
from services.placement.policy import PolicyConfig

DEFAULTS = PolicyConfig()
MAX_RATE = 1e6  # dollars per GPU-hour: beyond this it is earliest-finish anyway


class ProjectTradeoff(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exchange_rate: float = Field(ge=0, le=MAX_RATE, description="Dollars per GPU-hour sooner, for this project.")


class Tradeoff(BaseModel):
    """`[placement]` of cluster.toml; unknown keys are refused so a misspelt setting is not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    exchange_rate: float = Field(
        DEFAULTS.exchange_rate,
        ge=0,
        le=MAX_RATE,
        description="On-demand dollars worth paying to finish one GPU-hour sooner.",
    )
    cost_sensitive_weight: float = Field(DEFAULTS.cost_sensitive_weight, ge=0, le=1)
    projects: dict[str, ProjectTradeoff] = Field(default_factory=dict, max_length=10_000)

    def rate_for(self, project_id: str) -> float | None:
        """The project's own rate, or None for the cluster's (the policy config's) default."""
        project = self.projects.get(project_id)
        return project.exchange_rate if project else None


def tradeoff_from(cluster: ClusterFile) -> Tradeoff:
    """Check the [placement] section; a bad value stops the service with the field named."""
    try:
        return Tradeoff.model_validate(cluster.placement)
    except ValueError as exc:
        raise SystemExit(f"cluster file [placement]: {exc}") from None
