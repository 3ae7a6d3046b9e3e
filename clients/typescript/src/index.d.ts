// SPDX-License-Identifier: Apache-2.0
// Types of onceq's Node client (src/index.js).

export type JsonValue = null | boolean | number | string | JsonValue[] | { [k: string]: JsonValue };
export type CallStatus = 'pending' | 'running' | 'succeeded' | 'failed' | 'needs_review';

export declare const TERMINAL: readonly CallStatus[];
export type TaskStatus = 'running' | 'awaiting_approval' | 'succeeded' | 'compensating' |
  'compensated' | 'failed' | 'needs_review';
export type StepStatus = 'pending' | 'running' | 'succeeded' | 'failed' | 'needs_review' |
  'compensating' | 'compensated' | 'skipped';
export declare const TASK_TERMINAL: readonly TaskStatus[];
export declare const DEFAULT_URL: string;
export declare const SIGNATURE_HEADER: string;

/** A call as the producer returns it, plus replayed (Idempotent-Replayed) and terminal. */
export interface Call {
  call_id: string;
  tenant: string;
  idem_key: string;
  fingerprint: string;
  tool: string;
  args: { [k: string]: JsonValue };
  status: CallStatus;
  attempt: number;
  result: JsonValue | null;
  error: { code: string; message: string; retryable?: boolean } | null;
  effect_id: string | null;
  created_at: string;
  updated_at: string;
  expires_at: string;
  /** Where the settled call is delivered (a signed webhook), or null. */
  callback_url?: string | null;
  query_url: string;
  replayed: boolean;
  terminal: boolean;
  [extra: string]: unknown;
}

/** A step of a task request. args may cite "{steps.NAME.result.PATH}" / "{steps.NAME.object_id}". */
export interface TaskStepRequest {
  name: string;
  tool: string;
  args: { [k: string]: JsonValue };
  compensate?: { tool: string; args: { [k: string]: JsonValue } };
  irreversible?: boolean;
  /** The task waits in awaiting_approval before this step until an operator decides. */
  approval?: boolean;
}

/** A step of a task as the producer returns it. */
export interface TaskStep {
  name: string;
  tool: string;
  status: StepStatus;
  call_id: string | null;
  result: JsonValue | null;
  object_id: string | null;
  error: { code: string; message: string; retryable?: boolean } | null;
  irreversible: boolean;
  approval: boolean;
  /** Its compensation's call (status is the call's), or null without one. */
  compensation: {
    tool: string; call_id: string | null; status: string; attempts: number;
    result: JsonValue | null; error: { code: string; message: string } | null;
  } | null;
  [extra: string]: unknown;
}

/** A task as the producer returns it, plus replayed and terminal. */
export interface Task {
  task_id: string;
  tenant: string;
  idem_key: string;
  status: TaskStatus;
  reason: string | null;
  /** The review episode an operator's decision is made on (resolveTask). */
  fence: number;
  created_at: string;
  updated_at: string;
  steps: TaskStep[];
  replayed: boolean;
  terminal: boolean;
  [extra: string]: unknown;
}

export type TaskDecision = 'approve' | 'reject' | 'compensated' | 'succeeded' | 'retry-compensation';

export interface ClientOptions {
  /** Bearer token; default process.env.ONCEQ_TOKEN. */
  token?: string | null;
  /** Seconds per request (default 10). */
  timeout?: number;
  /** Seconds after the first attempt past which no retry starts (default 60). */
  retryDeadline?: number;
  /** First backoff step in seconds (default 0.2), doubled per retry up to backoffMax (5). */
  backoff?: number;
  backoffMax?: number;
  /** Attempts at most (default: no limit but the deadline). */
  maxTries?: number | null;
  /** Seconds each long-poll request asks the producer to hold (default 30). */
  pollWait?: number;
  /** Longest pause between two reads of waitTask, in seconds (default 2). */
  taskPollMax?: number;
  log?: (message: string) => void;
}

export interface SubmitOptions {
  /** The Idempotency-Key: the same on every retry of this request. */
  key: string;
  tenant?: string;
  /** Webhook: the producer POSTs the settled call here, signed (verifyWebhook). */
  callbackUrl?: string;
}

export declare class Client {
  constructor(url?: string, opts?: ClientOptions);
  readonly url: URL;
  token: string | null;
  submit(tool: string, args: { [k: string]: JsonValue }, opts: SubmitOptions): Promise<Call>;
  get(callId: string): Promise<Call>;
  getByKey(key: string, opts?: { tenant?: string }): Promise<Call>;
  wait(callId: string, opts?: { timeout?: number | null }): Promise<Call>;
  call(tool: string, args: { [k: string]: JsonValue },
       opts: SubmitOptions & { timeout?: number | null }): Promise<Call>;
  submitTask(steps: TaskStepRequest[], opts: { key: string; tenant?: string }): Promise<Task>;
  getTask(taskId: string): Promise<Task>;
  getTaskByKey(key: string, opts?: { tenant?: string }): Promise<Task>;
  waitTask(taskId: string,
           opts?: { timeout?: number | null; until?: readonly TaskStatus[] }): Promise<Task>;
  runTask(steps: TaskStepRequest[],
          opts: { key: string; tenant?: string; timeout?: number | null }): Promise<Task>;
  resolveTask(taskId: string, decision: TaskDecision,
              opts: { fence: number; note: string; by?: string }): Promise<Task>;
}

export declare class OnceqError extends Error {}
export declare class ApiError extends OnceqError {
  constructor(status: number, code: string, message: string, retryAfter?: number | null, body?: string);
  readonly status: number;
  /** The stable error code, e.g. "idempotency_conflict". */
  readonly code: string;
  readonly detail: string;
  readonly retryAfter: number | null;
  readonly body: string;
}
export declare class BadRequest extends ApiError {}
export declare class Unauthorized extends ApiError {}
export declare class Forbidden extends ApiError {}
export declare class TenantMismatch extends Forbidden {}
export declare class NotFound extends ApiError {}
export declare class MethodNotAllowed extends ApiError {}
export declare class PayloadTooLarge extends ApiError {}
export declare class IdempotencyConflict extends ApiError {}
/** 409 from resolveTask: not_awaiting_approval, not_in_review, not_retryable, review_moved. */
export declare class ReviewConflict extends ApiError {}
export declare class RateLimited extends ApiError {}
export declare class Unavailable extends ApiError {}
export declare class TransportError extends OnceqError {}
export declare class WaitTimeout extends OnceqError {
  constructor(message: string, call?: Call | Task | null);
  /** The last call (or, from waitTask, task) seen. */
  readonly call: Call | Task | null;
}
export declare class WebhookSignatureError extends OnceqError {}

export declare function errorFor(status: number, code: string, message: string,
                                 retryAfter?: number | null, body?: string): ApiError;
export declare function retryAfterSeconds(value: string | null | undefined): number | null;
export declare function canonicalize(value: JsonValue): string;
export declare function fingerprint(tenant: string, tool: string, args: JsonValue): string;
export declare function signWebhook(secret: string | Uint8Array, body: string | Uint8Array,
                                    timestamp?: number): string;
export declare function verifyWebhook(secret: string | Uint8Array, body: string | Uint8Array,
                                      header: string | null | undefined,
                                      opts?: { toleranceS?: number; now?: number }): number;
