"""The agent endpoint: an OpenAI-compatible chat completions server on 127.0.0.1 that an
agent (a user's program, stages.generate.agent) talks to while the run serves it the
policy: the HTTP server with its bounds (``_http``, ``_limits``), the routes
(``openai_api``), the chat rendering of OpenAI messages (``_openai_chat``) and the tool
calls parsed from completions (``_toolcalls``). A subsystem, not an operator: the
generate stages use it."""
