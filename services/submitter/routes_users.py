"""Users and their tokens: create users (admin), issue, list and revoke tokens (the admin or the user himself)."""

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from pymongo.errors import DuplicateKeyError

from shared.clock import utcnow
from services.submitter import errors
from services.submitter.auth import Principal, authenticate
from services.submitter.errors import ApiError

router = APIRouter(tags=["users"])
TEN_YEARS_S = 10 * 365 * 86400
UserName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
ExpiresIn = Annotated[
    int | None,
    Field(None, strict=True, ge=1, le=TEN_YEARS_S, description="Seconds until the token stops working; none: never."),
]


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    projects: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = Field(
        default_factory=list, max_length=100
    )
    admin: Annotated[bool, Field(strict=True)] = False
    expires_in: ExpiresIn = None


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expires_in: ExpiresIn = None


class User(BaseModel):
    user_name: str
    projects: list[str]
    admin: bool


class TokenInfo(BaseModel):
    token_id: str = Field(description="Names the token to revoke it; not a secret.")
    user_name: str
    created: str | None
    expires: str | None = Field(description="None: it does not expire.")
    last_used: str | None = Field(description="To the minute; None: never used.")
    source: str = Field(description="api, or configured/generated for the admin token made at start.")


class IssuedToken(User):
    token: str = Field(description="Shown once; only its hash is stored.")
    token_id: str
    expires: str | None


class TokenList(BaseModel):
    count: int
    items: list[TokenInfo]


async def existing_user(request: Request, user_name: str) -> dict:
    user = await request.app.state.tokens.user(user_name)
    if user is None:
        raise ApiError(404, errors.NOT_FOUND, f"user {user_name} does not exist")
    return user


def issued(user: dict, token: str, info: dict) -> IssuedToken:
    return IssuedToken(
        user_name=user["_id"],
        projects=user.get("projects", []),
        admin=bool(user.get("admin")),
        token=token,
        token_id=info["token_id"],
        expires=info["expires"],
    )


@router.post("/v2/users", status_code=201, response_model=IssuedToken, summary="Create a user")
async def create_user(body: UserCreate, request: Request, principal: Principal = Depends(authenticate)):
    principal.require_admin()
    tokens = request.app.state.tokens
    user = {"_id": body.user_name, "projects": body.projects, "admin": body.admin, "created_at": utcnow()}
    try:
        await tokens.add_user(user)
    except DuplicateKeyError:
        raise ApiError(409, errors.USER_EXISTS, f"user {body.user_name} already exists") from None
    return issued(user, *await tokens.issue(body.user_name, expires_in=body.expires_in))


@router.get("/v2/users", response_model=list[User], summary="List users")
async def list_users(request: Request, principal: Principal = Depends(authenticate)):
    principal.require_admin()
    docs = await request.app.state.tokens.all_users()
    return [User(user_name=d["_id"], projects=d.get("projects", []), admin=bool(d.get("admin"))) for d in docs]


@router.post(
    "/v2/users/{user_name}/tokens",
    status_code=201,
    response_model=IssuedToken,
    summary="Issue another token (the admin, or the user himself); at most TRAINMASTER_MAX_TOKENS_PER_USER live ones",
)
async def issue_token(
    user_name: UserName, request: Request, body: TokenCreate | None = None, principal: Principal = Depends(authenticate)
):
    principal.require_self_or_admin(user_name)
    user = await existing_user(request, user_name)
    expires_in = body.expires_in if body else None
    # A user's own token lives no longer than the one he asks with: else a 30-day token the admin gave would
    # issue itself one that never expires. The admin's tokens are his to give.
    not_after = None if principal.is_admin else principal.expires_s
    token = await request.app.state.tokens.issue(
        user_name, expires_in=expires_in, capped=not user.get("admin"), not_after=not_after
    )
    return issued(user, *token)


@router.get(
    "/v2/users/{user_name}/tokens",
    response_model=TokenList,
    summary="A user's tokens: id, created, expires, last used (never the secret)",
)
async def list_tokens(user_name: UserName, request: Request, principal: Principal = Depends(authenticate)):
    principal.require_self_or_admin(user_name)
    await existing_user(request, user_name)
    items = await request.app.state.tokens.of_user(user_name)
    return TokenList(count=len(items), items=[TokenInfo(**i) for i in items])


@router.delete(
    "/v2/users/{user_name}/tokens/{token_id}",
    status_code=204,
    summary="Revoke a token (the admin, or the user himself); it stops working at once",
)
async def revoke_token(
    user_name: UserName,
    token_id: Annotated[str, Path(pattern=r"^tk_[0-9a-f]{16}$")],
    request: Request,
    principal: Principal = Depends(authenticate),
) -> Response:
    principal.require_self_or_admin(user_name)
    if not await request.app.state.tokens.revoke(user_name, token_id):
        raise ApiError(404, errors.NOT_FOUND, f"user {user_name} has no token {token_id}")
    return Response(status_code=204)


@router.get("/v2/me", response_model=User, summary="Who the token belongs to")
async def me(principal: Principal = Depends(authenticate)):
    return User(user_name=principal.user_name, projects=sorted(principal.projects), admin=principal.is_admin)
