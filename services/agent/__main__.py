"""python -m services.agent --node-id ID [--cluster-file PATH]"""

import argparse

from shared.service import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="trainmaster-agent", description="Run the trainmaster agent of one node.")
    parser.add_argument("--node-id", help="this node's id in the cluster file (or TRAINMASTER_NODE_ID)")
    parser.add_argument("--cluster-file", help="TOML file with [[nodes]] (or TRAINMASTER_CLUSTER_FILE)")
    args = parser.parse_args()
    from services.agent.app import AgentSettings, create_app

    overrides = {k: v for k, v in {"node_id": args.node_id, "cluster_file": args.cluster_file}.items() if v}
    if args.cluster_file:  # a node's own file (on-demand): the cluster's [storage] rules stay those of the fleet's
        from shared.storage import StorageSettings

        overrides["storage_file"] = StorageSettings().cluster_file
    settings = AgentSettings(**overrides) if overrides else AgentSettings()
    run(create_app(settings))


if __name__ == "__main__":
    main()
