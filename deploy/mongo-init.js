// One MongoDB database per trainmaster service (trainmaster_<service>: the name each service's settings default
// to) and one user in it, whose role is limited to the collections that service owns (the README's process table). mongo:8 runs this once, with the root user, when its data volume is first created;
// docker-compose.yml mounts it into /docker-entrypoint-initdb.d and passes the passwords in the environment.
// A job, an agent or another service holding one service's credentials reads and writes nothing else: no other
// collection, no user administration, no other database. Each user authenticates against its own database
// (`?authSource=trainmaster_<service>` in its MONGO_URL).
// What pymongo needs for the services' reads, writes, upserts, aggregations and index creation at start.
const ACTIONS = ["find", "insert", "update", "remove", "createIndex", "listIndexes"];
const COLLECTIONS = {
  submitter: ["api_jobs", "api_queue", "api_job_list", "api_logs", "api_log_sizes", "api_users", "api_tokens", "api_projects",
              "api_notifications", "api_audit", "api_searches", "api_placements", "api_sealing"],
  placement: ["placement_jobs", "placement_nodes", "placement_usage"],
  monitor: ["monitor_jobs", "monitor_nodes", "monitor_rented", "monitor_early_terminates"],
  estimator: ["estimator_jobs", "estimator_points", "estimator_history", "estimator_own_runs",
              "estimator_placements", "estimator_telemetry"],
  billing: ["billing_ledger", "billing_open", "billing_nodes", "billing_nodes_open", "billing_node_info",
            "billing_quotas", "billing_alerts", "billing_jobs", "billing_attempts", "billing_parked", "billing_ends"],
};

for (const [service, collections] of Object.entries(COLLECTIONS)) {
  const database = `trainmaster_${service}`;
  const target = db.getSiblingDB(database);
  const variable = `TRAINMASTER_MONGO_${service.toUpperCase()}_PASSWORD`;
  const password = process.env[variable];
  if (!password || password.length < 16) {
    throw new Error(`${variable} must be set to a password of at least 16 characters`);
  }
  const role = `trainmaster_${service}`;
  target.createRole({
    role: role,
    privileges: collections.map((name) => ({ resource: { db: database, collection: name }, actions: ACTIONS })),
    roles: [],
  });
  target.createUser({ user: service, pwd: password, roles: [{ role: role, db: database }] });
  print(`trainmaster: user ${service} with role ${role} on ${collections.length} collections of ${database}`);
}
