"""What a route takes from the app: the use cases, built once at start (`app.build_submitter`), and the path
parameters the routes share."""

from typing import Annotated

from fastapi import Path, Request

from services.submitter.usecases import Submitter

ProjectId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The project the job belongs to.")]
JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The job's id (metadata.id).")]


def use_cases(request: Request) -> Submitter:
    return request.app.state.submitter
