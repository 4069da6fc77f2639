"""`trainmaster`: the researcher's command line for the REST API."""
