"""`s2s serve RUN_DIR`: a trained run behind HTTP, and a page to try it in a browser.

Built on Starlette (routing, requests, JSON responses) and uvicorn (the HTTP server): two small,
well-kept libraries, pure Python, that pull in no torch of their own. Endpoints:

    GET  /            the page (page/: HTML, a script and a style sheet; no build step)
    GET  /health      {"status": "ok", ...} once the model is loaded
    GET  /info        the run: its tasks (members), the checkpoint, decoding settings, limits
    POST /generate    {"text": [sentence, ...], "task": MEMBER?, "nbest": N?, "sampling":
                      {"temperature", "top_k", "top_p", "epsilon", "seed"}?, "mbr": "chrf" |
                      "bleu" | "task"?, "mbr_method": "pairwise" | "aggregate"?, "prefixes": [...]?,
                      "terms": [[s, t], ...]?} -> {"hypotheses", "scores", "nbest"?,
                      "unknown_words", "trees", "timing"}: `s2s generate`'s output lines
                      (docs/decoding.md has the options)
    POST /score       {"text": [sentence, ...], "targets": [output, ...], "task": MEMBER?} ->
                      {"scores": [{"logprob", "score", "tokens", "token_logprobs"}, ...]}: the
                      model's log-probability of each given output (`s2s generate --score-targets`)
    POST /attention   {"text": sentence, "task": MEMBER?, "layer": L?} -> the encoder-decoder
                      attention weights of layer L (default: the last), every head (an
                      ensemble's: its first model's, over the ensemble's output)

Requests wait in one queue and one worker decodes them in batches up to a token budget
(`batcher`). A bad request gets a 4xx answer {"error": "..."} naming what is wrong, before it is
queued; the server goes on.

The modules: `bodies` (the typed request bodies, pydantic models), `requests` (a body read
and checked against the run, the limits), `app` (the endpoints),
`batcher` (the decoding worker), `connections` (client connections bounded), `server` (the
command's work: socket, run, uvicorn), `treesvg` (a parser's trees drawn for the page).
"""
