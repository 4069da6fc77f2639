"""A kubeconfig exec plugin (as `aws eks get-token` is one): prints an ExecCredential carrying the token it is
given as its one argument."""

import json
import sys

print(
    json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "kind": "ExecCredential",
            "status": {"token": sys.argv[1]},
        }
    )
)
