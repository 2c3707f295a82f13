"""The agent endpoint's wire: what an OpenAI-compatible chat completions server needs,
apart from the episodes it serves. The bounded HTTP server (``_http``, with the size and
depth limits of ``_limits``), the chat rendering of OpenAI messages (``_openai_chat``)
and the tool calls parsed from completions (``_toolcalls``). A subsystem, not an
operator: the server itself (stages.generate.openai_api, whose requests join the turn
waves of the generate stage's episodes) and the Agent stage (stages.generate.agent) use
it."""
