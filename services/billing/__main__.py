from shared.service import run
from services.billing.app import create_app

if __name__ == "__main__":
    run(create_app())
