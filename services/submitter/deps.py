"""What a route takes from the app: the use cases, built once at start (`app.build_submitter`)."""
from fastapi import Request

from services.submitter.usecases import Submitter


def use_cases(request: Request) -> Submitter:
    return request.app.state.submitter
