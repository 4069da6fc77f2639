import uvicorn

from services.submitter.app import SubmitterSettings, create_app

if __name__ == "__main__":
    settings = SubmitterSettings()
    uvicorn.run(create_app(settings), host=settings.api_host, port=settings.api_port, log_level="warning")
