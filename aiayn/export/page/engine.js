// The contract's encoder.onnx and decoder.onnx in onnxruntime-web (docs/onnx.md, "Decoding with the graphs"),
// behind the step interface of aiayn/search/step.py: start, step, select, and the ids never generated. The state between steps is plain
// typed arrays with their shapes: the cross-attention keys/values, the source mask, the self-attention cache.
// Which ONNX Runtime build runs them is chosen when the page loads (`OrtEngine.load`): its WebGPU build where the
// browser offers a WebGPU adapter, else its WASM build; each is loaded only by the browsers that use it.
let ort;

/** "webgpu" where asked for or ("auto") where the browser offers an adapter, else "wasm". */
export async function pickDevice(device) {
  if (device === "wasm") return "wasm";
  const adapter = "gpu" in navigator ? await navigator.gpu.requestAdapter().catch(() => null) : null;
  if (adapter) return "webgpu";
  if (device === "webgpu") throw new Error("this browser offers no WebGPU adapter; open the page with ?device=wasm");
  return "wasm";
}

// WASM threads beyond this many measured no faster (onnxruntime-web's own default stops at 4 too).
export const MAX_THREADS = 4;

/** The WASM threads the page runs: one per core of the visitor's (at most MAX_THREADS, or `asked` where given)
 * where the page is cross-origin isolated (its server sends COOP and COEP, as the folder's Space and preview.py
 * do: threads share memory, which a browser gives no other page), else one. */
export function wasmThreads(asked) {
  if (!globalThis.crossOriginIsolated) return 1;
  const cores = navigator.hardwareConcurrency || 1;
  return Math.max(1, Math.min(asked || cores, cores, MAX_THREADS));
}

function tensor(type, data, dims) {
  return new ort.Tensor(type, data, dims);
}

/** Rows of a (rows, ...) array, in the order of `rows` (repeated or dropped as they say). */
function gather(array, rows) {
  const size = array.dims[0] ? array.data.length / array.dims[0] : 0;
  const data = new array.data.constructor(rows.length * size);
  rows.forEach((row, i) => data.set(array.data.subarray(row * size, (row + 1) * size), i * size));
  return { data, dims: [rows.length, ...array.dims.slice(1)] };
}

export class OrtEngine {
  constructor(web, config, encoder, decoder, threads) {
    this.web = web;
    this.threads = threads;
    const special = web.special_tokens;
    this.bos = special.bos;
    this.eos = special.eos;
    this.pad = special.pad;
    this.neverGenerate = new Set(web.never_generate);
    this.vocab = config.model.vocab_size;
    this.encoder = encoder;
    this.decoder = decoder;
  }

  /** Both graphs on `device` ("webgpu" or "wasm"), WASM on `threads` threads (`wasmThreads`): the threads split
   * each product's rows and columns, never a sum, so every thread count gives `aiayn translate`'s answers
   * (WebGPU's float arithmetic is not the CPU's: its answers may differ slightly). */
  static async load(web, config, device, threads, timed = (name, promise) => promise) {
    // Both graphs read their weights from one file (each tensor stored once, the embedding they share included):
    // fetched once, its bytes handed to both sessions; the download runs while ONNX Runtime's module loads.
    const download = timed(
      "weights",
      fetch(web.weights).then(async (response) => {
        if (!response.ok) throw new Error(`${web.weights}: ${response.status} ${response.statusText}`);
        return new Uint8Array(await response.arrayBuffer());
      }),
    );
    ort = await timed("runtime", import(device === "webgpu" ? "./ort.webgpu.min.mjs" : "./ort.wasm.min.mjs"));
    ort.env.wasm.numThreads = threads;
    const providers = device === "webgpu" ? ["webgpu", "wasm"] : ["wasm"];
    const weights = await download;
    const options = {
      executionProviders: providers,
      // The graphs come fused (export/web_graphs.py); what is left is folding their constants: the fp16 weights
      // into fp32, the w8/w4 blocks, the shapes.
      graphOptimizationLevel: "basic",
      externalData: [{ path: web.weights, data: weights }],
    };
    // One after the other: created at once, the two sessions opened later (a page's first translation at 8-15 s
    // against 3-11 s in alternating runs on a busy machine).
    const encoder = await timed("encoder session", ort.InferenceSession.create(web.encoder, options));
    const decoder = await timed("decoder session", ort.InferenceSession.create(web.decoder, options));
    return new OrtEngine(web, config, encoder, decoder, threads);
  }

  /** Encode a batch of source id lists (each ending in </s>), right-padded. */
  async start(srcIds) {
    const rows = srcIds.length;
    const width = Math.max(...srcIds.map((ids) => ids.length));
    const ids = new BigInt64Array(rows * width).fill(BigInt(this.pad));
    const mask = new Uint8Array(rows * width);
    srcIds.forEach((row, r) =>
      row.forEach((id, i) => {
        ids[r * width + i] = BigInt(id);
        mask[r * width + i] = 1;
      }),
    );
    const { names, cross, past, kv_shape: kvShape } = this.web;
    const out = await this.encoder.run({ [names.src_ids]: tensor("int64", ids, [rows, width]) }, cross);
    const empty = { data: new Float32Array(0), dims: [rows, ...kvShape.slice(0, 1), 0, ...kvShape.slice(1)] };
    return {
      offset: 0,
      mask: { data: mask, dims: [rows, width] },
      cross: cross.map((name) => ({ data: out[name].data, dims: out[name].dims })),
      past: past.map(() => empty),
    };
  }

  /** Feed one token per row after the cache: (the next token's log-probabilities (rows × vocab), the state). */
  async step(state, tokens) {
    const { names, cross, past, present } = this.web;
    const rows = tokens.length;
    const feeds = {
      [names.tgt_ids]: tensor("int64", BigInt64Array.from(tokens, BigInt), [rows, 1]),
      [names.position_offset]: tensor("int64", BigInt64Array.of(BigInt(state.offset)), []),
      [names.src_mask]: tensor("bool", state.mask.data, state.mask.dims),
    };
    cross.forEach((name, i) => (feeds[name] = tensor("float32", state.cross[i].data, state.cross[i].dims)));
    past.forEach((name, i) => (feeds[name] = tensor("float32", state.past[i].data, state.past[i].dims)));
    const out = await this.decoder.run(feeds, [names.log_probs, ...present]);
    const next = {
      ...state,
      offset: state.offset + 1,
      past: present.map((name) => ({ data: out[name].data, dims: out[name].dims })),
    };
    return [out[names.log_probs].data, next];
  }

  /** Keep, repeat or reorder rows of the state: row i of the result is rows[i]. */
  select(state, rows) {
    return {
      offset: state.offset,
      mask: gather(state.mask, rows),
      cross: state.cross.map((array) => gather(array, rows)),
      past: state.past.map((array) => gather(array, rows)),
    };
  }
}
