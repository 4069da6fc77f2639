"""The tags placement's EC2 provider puts on every instance it launches, and by which the minter (asking EC2 with
its own read-only keys) tells the platform's instances: one definition, so the two never disagree on a name (a
minter looking for another tag would revoke every rented node)."""

TAG_CLUSTER = "trainmaster:cluster"
TAG_NODE = "trainmaster:node-id"
TAG_JOB = "trainmaster:job"
TAG_TYPE = "trainmaster:instance-type"
