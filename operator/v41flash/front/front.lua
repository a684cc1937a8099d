-- The front's per-request step (Envoy's Lua filter, on Envoy's worker threads; nothing here sees a response).
-- Settings come first, written by the renderer (front/envoy.py): SESSION_KEY_MODE, SESSION_HEADER,
-- API_KEY_ENV, PROMPT_KEY_BYTES, HASHED_BYTES, KEYED_PATHS, SERVING_PATHS.
-- For each request it:
--   * checks the API key (serving paths only; health stays open for the kubelet) and removes it;
--   * on POST to a keyed path, sets x-session-id when the client sent none: the configured client header's value,
--     else a hash of the conversation's first non-system message (chat) or of the prompt's first bytes;
--   * sets x-v41flash-bucket (0..9999, from the session key: the revision split's routes match on it) and
--     x-v41flash-class (where the key came from, "-first" on a conversation's first turn: the front's counters).
-- The body is scanned, not validated (the engine validates it); a body the scan cannot follow is refused (400).
local byte, find, sub, format = string.byte, string.find, string.sub, string.format
local bxor, tobit, lshift, band = bit.bxor, bit.tobit, bit.lshift, bit.band

local API_KEY = nil
if API_KEY_ENV ~= "" then API_KEY = os.getenv(API_KEY_ENV) or "" end

-- FNV-1a, 32 bits, over s[i..j]; two offsets give two independent words of one key
local function fnv(s, i, j, h)
  for k = i, j do
    h = bxor(h, byte(s, k))
    h = tobit(h * 403 + lshift(h, 24))  -- h * 16777619 mod 2^32, exact in doubles
  end
  return h
end

local function u32(h) return h < 0 and h + 4294967296 or h end

local function key_of(s, i, j)
  if j - i + 1 > HASHED_BYTES then j = i + HASHED_BYTES - 1 end
  return format("p-%08x%08x", u32(fnv(s, i, j, -2128831035)), u32(fnv(s, i, j, 1594194933)))
end

local function ws(s, i) return find(s, "[^ \t\r\n]", i) end

local function skip_string(s, i)  -- s[i] is '"': the index after the closing quote
  local j = i + 1
  while true do
    local k = find(s, '["\\]', j)
    if not k then return nil end
    if byte(s, k) == 34 then return k + 1 end
    j = k + 2
  end
end

local function skip_container(s, i)  -- s[i] is '{' or '[': the index after its match
  local depth, j = 0, i
  while true do
    local k = find(s, '[%[%]{}"]', j)
    if not k then return nil end
    local c = byte(s, k)
    if c == 34 then
      j = skip_string(s, k)
      if not j then return nil end
    elseif c == 91 or c == 123 then
      depth, j = depth + 1, k + 1
    else
      depth, j = depth - 1, k + 1
      if depth == 0 then return j end
    end
  end
end

local function skip_value(s, i)  -- (end + 1, start) of the value at or after i
  i = ws(s, i)
  if not i then return nil end
  local c = byte(s, i)
  if c == 34 then return skip_string(s, i), i end
  if c == 123 or c == 91 then return skip_container(s, i), i end
  return find(s, "[,%]}%s]", i) or #s + 1, i
end

-- after a value that ends before j: (the next item's index) or (nil, the index after the closing byte close);
-- nothing when the text is not a separator or that close
local function next_item(s, j, close)
  j = ws(s, j)
  if not j then return nil end
  local b = byte(s, j)
  if b == close then return nil, j + 1 end
  if b ~= 44 then return nil end
  return (ws(s, j + 1))  -- one value: find also returns where the match ends
end

-- each member of the object at s[i] ('{'): f(name, value start, value end + 1); true from f stops the walk
local function members(s, i, f)
  local j = ws(s, i + 1)
  if not j then return nil end
  if byte(s, j) == 125 then return j + 1 end
  while true do
    if byte(s, j) ~= 34 then return nil end
    local ke = skip_string(s, j)
    if not ke then return nil end
    local c = ws(s, ke)
    if not c or byte(s, c) ~= 58 then return nil end
    local ve, vs = skip_value(s, c + 1)
    if not ve then return nil end
    if f(sub(s, j + 1, ke - 2), vs, ve) then return true end
    local done
    j, done = next_item(s, ve, 125)
    if done then return done end
    if not j then return nil end
  end
end

-- each element of the array at s[i] ('['): f(start, end + 1); true from f stops the walk
local function elements(s, i, f)
  local j = ws(s, i + 1)
  if not j then return nil end
  if byte(s, j) == 93 then return j + 1 end
  while true do
    local ve, vs = skip_value(s, j)
    if not ve then return nil end
    if f(vs, ve) then return true end
    local done
    j, done = next_item(s, ve, 93)
    if done then return done end
    if not j then return nil end
  end
end

-- (key or nil, first turn, ok) of a chat body: the first non-system message's content; a first turn has one
-- non-system message and it is the user's
local function chat_key(s, top)
  local key, first, ok, msgs = nil, false, true, nil
  if not members(s, top, function(name, vs, ve)
    if name == "messages" then msgs = vs; return true end
  end) then return nil, false, false end
  if not msgs then return nil, false, true end
  if byte(s, msgs) ~= 91 then return nil, false, true end
  local others, first_role = 0, nil
  ok = elements(s, msgs, function(vs, ve)
    if byte(s, vs) ~= 123 then return false end
    local role, cs, ce = nil, nil, nil
    if not members(s, vs, function(name, a, b)
      if name == "role" then role = sub(s, a, b - 1) elseif name == "content" then cs, ce = a, b end
    end) then ok = false; return true end
    if role ~= '"system"' then
      others = others + 1
      if others == 1 then
        first_role = role
        key = cs and key_of(s, cs, ce - 1) or key_of(s, vs, ve - 1)
      else
        return true  -- a second non-system message: not a first turn, nothing more to read
      end
    end
  end) and ok
  if not ok then return nil, false, false end
  if key == nil and msgs then  -- only system messages: the first one keys the session
    elements(s, msgs, function(vs, ve) key = key_of(s, vs, ve - 1); return true end)
  end
  return key, others == 1 and first_role == '"user"', true
end

local function completion_key(s, top)
  local key = nil
  if not members(s, top, function(name, vs, ve)
    if name ~= "prompt" then return false end
    local c = byte(s, vs)
    if c == 34 then  -- a string: its first bytes
      if ve - vs > 2 then key = key_of(s, vs + 1, math.min(ve - 2, vs + PROMPT_KEY_BYTES)) end
    elseif c == 91 then  -- a batch of prompts (the first keys it) or token ids (their first bytes)
      elements(s, vs, function(a, b)
        local d = byte(s, a)
        if d == 34 then key = key_of(s, a + 1, math.min(b - 2, a + PROMPT_KEY_BYTES))
        elseif d == 91 then key = key_of(s, a, math.min(b - 1, a + PROMPT_KEY_BYTES - 1))
        else key = key_of(s, vs, math.min(ve - 1, vs + PROMPT_KEY_BYTES - 1)) end
        return true
      end)
    end
    return true
  end) then return nil, false end
  return key, true
end

local function refuse(h, status, kind, message)
  h:respond({[":status"] = tostring(status), ["content-type"] = "application/json",
             ["x-v41flash-refused"] = kind},
            format('{"error":{"message":"%s","type":"%s","code":%d}}', message, kind, status))
end

-- constant time in the key's length (the length itself is not secret)
local function same(a, b)
  if #a ~= #b then return false end
  local d = 0
  for k = 1, #a do d = bit.bor(d, bxor(byte(a, k), byte(b, k))) end
  return d == 0
end

function envoy_on_request(h)
  local headers = h:headers()
  headers:remove("x-v41flash-bucket")  -- the front's own: a client cannot pick a revision
  headers:remove("x-v41flash-class")
  local path = headers:get(":path") or ""
  local q = find(path, "?", 1, true)
  if q then path = sub(path, 1, q - 1) end
  if API_KEY ~= nil and SERVING_PATHS[path] then
    local auth = headers:get("authorization") or ""
    if API_KEY == "" or sub(auth, 1, 7):lower() ~= "bearer " or not same(auth:sub(8):match("^%s*(.-)%s*$"), API_KEY) then
      refuse(h, 401, "unauthorized", "missing or wrong API key (Authorization: Bearer <key>)")
      return
    end
    headers:remove("authorization")  -- the front's own credential: routers and engines never see it
  end
  if headers:get(":method") ~= "POST" or not KEYED_PATHS[path] then return end
  local source, first, key = "client", false, headers:get("x-session-id")
  if SESSION_KEY_MODE == "client" then
    source = key and "client" or "none"
  else
    if not key and SESSION_HEADER ~= "" then
      key = headers:get(SESSION_HEADER)
      if key then source = "header" end
    end
    if path == "/v1/chat/completions" or not key then  -- chat bodies are read for the first-turn count too
      local body = h:body(true)
      local s = body and body:getBytes(0, body:length()) or ""
      headers = h:headers()  -- body() may have yielded: the earlier handle is gone
      local top = ws(s, 1)
      if not top or byte(s, top) ~= 123 then
        refuse(h, 400, "invalid_request", "request body is not a JSON object")
        return
      end
      local derived, ok
      if path == "/v1/chat/completions" then derived, first, ok = chat_key(s, top)
      else derived, ok = completion_key(s, top) end
      if not ok then
        refuse(h, 400, "invalid_request", "request body is not JSON the front can read")
        return
      end
      if not key then
        key = derived
        source = key and "derived" or "none"
      end
    end
    if key and source ~= "client" then headers:replace("x-session-id", key) end
  end
  -- no key: a random bucket, so unkeyed requests split by the shares too
  local b = key and u32(fnv(key, 1, #key, -2128831035)) % 10000 or math.random(0, 9999)
  headers:replace("x-v41flash-bucket", tostring(b))
  headers:replace("x-v41flash-class", first and source .. "-first" or source)
end
