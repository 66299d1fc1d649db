// The official `openai` npm client against a running `tessera serve`
// (tests/serve_test.sh starts it). Usage:
//   node openai_client_test.mjs BASE_URL MODEL EXPECTED_TEXT
// EXPECTED_TEXT: `tessera generate`'s greedy 24-token continuation of
// "Once upon a time" on the same model. Prints PASS/FAIL lines; exits 1 on
// any failure.
import OpenAI from 'openai';

const [baseURL, model, expected] = process.argv.slice(2);
const client = new OpenAI({baseURL, apiKey: 'unused', maxRetries: 0});
let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`PASS: ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL: ${name}: ${e && e.stack ? e.stack : e}`);
  }
}
function assert(cond, what) {
  if (!cond) throw new Error(what);
}

await check('models.list', async () => {
  const page = await client.models.list();
  assert(page.data.length === 1 && page.data[0].id === model,
         JSON.stringify(page.data));
});

await check('completions.create equals offline generation', async () => {
  const r = await client.completions.create(
      {model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0});
  assert(r.choices[0].text === expected,
         `got ${JSON.stringify(r.choices[0].text)}`);
  assert(r.choices[0].finish_reason === 'length', r.choices[0].finish_reason);
  assert(r.usage.completion_tokens === 24, JSON.stringify(r.usage));
  assert(r.usage.total_tokens === r.usage.prompt_tokens + 24,
         JSON.stringify(r.usage));
});

await check('completions stream equals offline generation', async () => {
  const stream = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
    stream: true, stream_options: {include_usage: true}
  });
  let text = '', usage = null, finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert(text === expected, `got ${JSON.stringify(text)}`);
  assert(finish === 'length', finish);
  assert(usage && usage.completion_tokens === 24, JSON.stringify(usage));
});

await check('completions with n, several prompts, logprobs and stop',
            async () => {
  const r = await client.completions.create({
    model, prompt: ['Once upon a time', 'The cat'], max_tokens: 12,
    temperature: 0.8, seed: 5, n: 2, logprobs: 3, stop: ['zzz']
  });
  assert(r.choices.length === 4, r.choices.length);
  for (const c of r.choices) {
    assert(c.logprobs.tokens.length === c.logprobs.token_logprobs.length,
           'logprob lengths');
    assert(c.logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1),
           'top logprobs');
  }
});

await check('chat.completions.create', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{role: 'user', content: 'Tell me a story'}],
    max_completion_tokens: 16, temperature: 0
  });
  const m = r.choices[0].message;
  assert(m.role === 'assistant' && typeof m.content === 'string' &&
             m.content.length > 0,
         JSON.stringify(m));
  assert(r.usage.completion_tokens <= 16, JSON.stringify(r.usage));
});

await check('chat stream', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{role: 'user', content: 'Tell me a story'}],
    max_completion_tokens: 16, temperature: 0, stream: true
  });
  let content = '', role = null, finish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.role) role = d.role;
    if (d.content) content += d.content;
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert(role === 'assistant', role);
  assert(content.length > 0, 'no content');
  assert(finish === 'length' || finish === 'stop', finish);
});

// Structured output through the client's own helpers.
const personSchema = {
  type: 'object',
  properties: {
    name: {type: 'string', maxLength: 12},
    age: {type: 'integer', minimum: 0, maximum: 120},
    pets: {type: 'array', maxItems: 3, items: {enum: ['cat', 'dog']}}
  },
  required: ['name', 'age', 'pets'],
  additionalProperties: false
};
function isPerson(p) {
  return p && typeof p.name === 'string' && p.name.length <= 12 &&
      Number.isInteger(p.age) && p.age >= 0 && p.age <= 120 &&
      Array.isArray(p.pets) && p.pets.length <= 3 &&
      p.pets.every((x) => x === 'cat' || x === 'dog') &&
      Object.keys(p).length === 3;
}

await check('chat.completions.parse with a strict json_schema', async () => {
  const r = await client.chat.completions.parse({
    model, messages: [{role: 'user', content: 'Describe a person'}],
    max_completion_tokens: 300, temperature: 0.7, seed: 11,
    response_format: {
      type: 'json_schema',
      json_schema: {name: 'person', strict: true, schema: personSchema}
    }
  });
  const m = r.choices[0].message;
  assert(r.choices[0].finish_reason === 'stop', r.choices[0].finish_reason);
  assert(isPerson(m.parsed), JSON.stringify(m));
});

await check('streamed completion with response_format json_object', async () => {
  const stream = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 300, temperature: 0.8,
    seed: 5, stream: true, response_format: {type: 'json_object'}
  });
  let text = '', finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.text ?? '';
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  if (finish === 'stop') {
    const v = JSON.parse(text);
    assert(v && typeof v === 'object' && !Array.isArray(v), text);
  } else {
    assert(finish === 'length' && text.startsWith('{'), `${finish} ${text}`);
  }
});

await check('streamed chat with guided_choice (a vLLM field)', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{role: 'user', content: 'Happy or sad?'}],
    max_completion_tokens: 20, stream: true, guided_choice: ['happy', 'sad']
  });
  let content = '', finish = null;
  for await (const chunk of stream) {
    content += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert(finish === 'stop' && (content === 'happy' || content === 'sad'),
         `${finish} ${JSON.stringify(content)}`);
});

// Tools: the server runs with --tool-call-parser hermes. "required" and a
// named function are forced by the structured-output engine, so the client's
// tool helpers get real calls from the demo model.
const personTool = {
  type: 'function',
  function: {name: 'save_person', description: 'Save a person', strict: true,
             parameters: personSchema}
};

await check('chat.completions.parse with a strict tool and tool_choice required',
            async () => {
  const r = await client.chat.completions.parse({
    model, messages: [{role: 'user', content: 'Save a person'}],
    max_completion_tokens: 400, temperature: 0.7, seed: 3,
    tools: [personTool], tool_choice: 'required', parallel_tool_calls: false
  });
  const c = r.choices[0];
  assert(c.finish_reason === 'tool_calls', c.finish_reason);
  assert(c.message.tool_calls.length === 1, JSON.stringify(c.message));
  const call = c.message.tool_calls[0];
  assert(call.type === 'function' && call.function.name === 'save_person' &&
             call.id.startsWith('chatcmpl-tool-'),
         JSON.stringify(call));
  assert(isPerson(call.function.parsed_arguments), JSON.stringify(call));
});

await check('runTools with a named tool_choice calls the function once', async () => {
  const calls = [];
  const runner = client.chat.completions.runTools({
    model, messages: [{role: 'user', content: 'Save a person'}],
    max_completion_tokens: 400, temperature: 0.7, seed: 8,
    tool_choice: {type: 'function', function: {name: 'save_person'}},
    tools: [{
      type: 'function',
      function: {name: 'save_person', parameters: personSchema, parse: JSON.parse,
                 function: (p) => { calls.push(p); return 'saved'; }}
    }]
  });
  const final = await runner.finalChatCompletion();
  assert(calls.length === 1 && isPerson(calls[0]), JSON.stringify(calls));
  assert(final.choices[0].finish_reason === 'stop', final.choices[0].finish_reason);
});

await check('chat.completions.stream with tool_choice required', async () => {
  // A random-weight model may run a string past max_tokens; the client
  // then rightly refuses to parse, so a few seeds are tried and the first
  // that finishes is checked in full.
  let final = null;
  let doneEvents = 0;
  for (const seed of [21, 22, 23, 24, 25, 26]) {
    doneEvents = 0;
    const stream = client.chat.completions.stream({
      model, messages: [{role: 'user', content: 'Save a person'}],
      max_completion_tokens: 400, temperature: 0.7, seed,
      tools: [personTool], tool_choice: 'required', parallel_tool_calls: false
    });
    stream.on('tool_calls.function.arguments.done', () => { doneEvents++; });
    try {
      final = await stream.finalChatCompletion();
      break;
    } catch (e) {
      if (!/length limit was reached/.test(String(e))) throw e;
    }
  }
  assert(final !== null, 'every seed ran past max_tokens');
  const c = final.choices[0];
  assert(c.finish_reason === 'tool_calls', c.finish_reason);
  assert(c.message.tool_calls.length >= 1 && doneEvents === c.message.tool_calls.length,
         `${doneEvents} ${JSON.stringify(c.message)}`);
  for (const call of c.message.tool_calls) {
    assert(isPerson(JSON.parse(call.function.arguments)), JSON.stringify(call));
  }
});

await check('a bad parameter is a 400 naming it', async () => {
  try {
    await client.completions.create(
        {model, prompt: 'x', temperature: 'hot', max_tokens: 2});
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.BadRequestError, `${e}`);
    assert(e.status === 400 && e.param === 'temperature',
           `${e.status} ${e.param}`);
  }
});

await check('an unknown model is a 404', async () => {
  try {
    await client.completions.create({model: 'nope', prompt: 'x'});
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.NotFoundError, `${e}`);
  }
});

process.exit(failures === 0 ? 0 : 1);
